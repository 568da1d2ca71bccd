"""Build: a rendered release into an image with BuildKit (image.py), and the offline base (base.py).

image.py renders the context (render/), writes the secrets (CA bundle, pip.conf) outside it, and drives
BuildKit through the docker CLI; base.py bootstraps a Debian root with debootstrap and imports it.
"""
