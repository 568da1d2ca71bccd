"""The workstation target: the image served by this machine's Docker engine (verbs.py), and a service's
balancer as an haproxy container beside the replicas (balancer.py). No cloud, no credentials."""
