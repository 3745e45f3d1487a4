"""disco_edge: the torch-free DISCO node engine (one rank of an ONNX export on ONNX Runtime + ZeroMQ).

It imports only the standard library, numpy, onnxruntime and pyzmq, and never ``disco`` (whose package pulls
PyTorch in its runtime), so it installs on a device alone (``edge/pyproject.toml``, see docs/edge.md).
Run it as ``python -m disco_edge RANK_FOLDER ...`` or ``disco-node``.
"""

__version__ = "0.1.0"
