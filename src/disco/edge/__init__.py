"""Torch-free pieces that run an ONNX export (numpy + onnxruntime only)."""
