"""Doctor: what this machine has for ngcx, one check per line (checks.py): engine, BuildKit, logins,
the loopback registry, NVIDIA driver and toolkit, disk, offline bases, interrupted deployments.
It sits above the other library packages because it looks at all of them.
"""
