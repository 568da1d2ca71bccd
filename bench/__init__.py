"""ngcx's benchmarks: `python -m bench SUITE… [--repeat N | --quick] [--out DIR]` (see bench/__main__.py).

  __main__.py, core.py      the runner, and the figures every suite reports (min / median / max, ratios)
  report.py, chart.py       BENCHMARKS.md and one PNG per suite, from the suites' JSON
  suites/                   one module per suite (cli, build, project, push, deploy, runtime) and the
                            helpers beside it, named after it (push_registry.py, project_figures.py, ...)
  naive/                    the hand-written Dockerfiles the build and project suites compare against
  gpu/                      scripts run by hand on a lent GPU machine (python3 bench/gpu/NAME.py --help)
  gpu_shim.py               makes ngcx_runtime importable from a plain checkout (gpu/ and tests/gpu use it)
  results/                  each suite's <suite>.json and .png, and saved runs by what they measured
                            (results/README.md says which command wrote each folder)
"""
