"""recipes/*.j2 compiled to Python by ngcx/render/precompiled.py (its docstring says why and when one is used).

Generated files only: NGCX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/render/test_precompiled.py rewrites them.
"""
