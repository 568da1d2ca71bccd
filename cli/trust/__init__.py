"""Trust: what runs is what was built (DESIGN.md "Trust", issue 48).

An image's SBOM made from inside it (sbom.py), its signature and attestations in the registry in
cosign's formats so a user's own `cosign verify --key` reads them (the signing modules), and the
verification every deploy runs before a container starts. Sits above registry/ (it reads and writes
the registry's manifests through registry/api.py) and below project/ and deploy/, which call it.
"""
