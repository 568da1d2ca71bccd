"""ngcx: version-pinned GPU containers from catalog to cloud GPU."""

from ngcx_runtime import __version__  # one version for the CLI and the runtime it builds in

__all__ = ["__version__"]
