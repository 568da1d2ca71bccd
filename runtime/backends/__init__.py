"""Inference backends: real engines only (TensorRT, ONNX Runtime, PyTorch)."""
