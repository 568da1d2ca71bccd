"""`deploy --cloud kubernetes`: the same service written as manifests (Deployment, Service, HPA, PDB, or a
KServe InferenceService) for any cluster (manifests.py), with node selection per GPU kind (nodes.yaml)."""
