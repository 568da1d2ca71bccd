"""ngcx: version-pinned GPU containers from catalog to cloud GPU."""
