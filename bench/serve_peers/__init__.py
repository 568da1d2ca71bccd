"""The serving peers of `python -m bench serve-peers` (issue 24): how each is installed, configured and started.

Each peer lives in its own virtual environment (they pin conflicting versions: MLServer and KServe pin different
FastAPI / pydantic ranges, Ray brings its own), made once under $XDG_CACHE_HOME/ngcx/bench-peers/NAME-HASH with
the same onnxruntime and numpy as ngcx's, and serves the same ONNX file through onnxruntime's CPU provider behind
the peer's own server, configured as its documentation recommends, with the same batching window as ngcx.
servers/ holds the small programs each peer runs (a runtime class or an API class, as its docs show).
"""
