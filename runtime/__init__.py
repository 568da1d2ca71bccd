"""ngcx-runtime: optimize, serve, bench and inspect models inside every ngcx image."""

# The one version of ngcx and ngcx-runtime: pyproject.toml reads it (dynamic version), render.py
# writes it into the runtime package built into every image, and plan manifests and /v2 report it.
__version__ = "0.5.0"
