"""ngcx's benchmarks: `python -m bench SUITE… [--repeat N] [--out DIR]` (see bench/__main__.py).

The older one-purpose scripts beside this package (cli_startup.py, image_sizes.py, ...) still run
on their own; suites that do not wrap them yet say so when skipped.
"""
