"""Where tracing failed: the file and line of the model's code that torch.fx could not record."""

from __future__ import annotations

import os
import traceback
from types import TracebackType

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the tracer (disco.graph)


def trace_site(tb: TracebackType | None) -> str | None:
    """'path/to/model.py:42 in forward: if x.sum() > 0:' for the innermost frame of ``tb`` outside torch and
    disco (the model's code where a data-dependent branch or a Proxy iteration stopped the tracer), or None."""
    site = None
    for frame in traceback.extract_tb(tb):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TORCH_DIR) or path.startswith(_OWN_DIR) or frame.filename.startswith("<"):
            continue
        site = frame
    if site is None:
        return None
    code = f": {site.line.strip()}" if site.line else ""
    return f"{site.filename}:{site.lineno} in {site.name}{code}"
