"""Test: a built image's pins checked against what actually loads in it (image.py).

The probe (ngcx_runtime.probe) runs inside the container; image.py compares its report with the
image's pin labels and runs the image's own tests. A project's examples are checked by project/check.py.
"""
