"""ngcx-runtime: optimize, serve, bench and inspect models inside every ngcx image."""
