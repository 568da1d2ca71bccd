"""This workstation: its GPUs and driver against a release's floor (host.py), which local image a
reference names (host.py), the images ngcx built here (images.py), and `docker run` lines (run.py).
"""
