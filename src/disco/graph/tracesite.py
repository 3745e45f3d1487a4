"""Where in the model's source an op comes from: the file and line of the model's code that torch.fx could not
record (a tracing failure), or that made an fx node (a refusal at partition time)."""

from __future__ import annotations

import os
import re
import traceback
from types import TracebackType

import torch
from torch import fx

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the tracer (disco.graph)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)\n(?P<code>[^\n]*)')


def _outside(path: str) -> bool:
    """Is ``path`` the model's code (not torch's, not the tracer's, not generated code)?"""
    if path.startswith("<"):
        return False
    path = os.path.abspath(path)
    return not (path.startswith(_TORCH_DIR) or path.startswith(_OWN_DIR))


def _site(filename: str, lineno: int | str, name: str, line: str | None) -> str:
    code = f": {line.strip()}" if line and line.strip() else ""
    short = filename.split("site-packages" + os.sep, 1)[-1]  # timm/models/levit.py, not the venv's path
    return f"{short}:{lineno} in {name}{code}"


def trace_site(tb: TracebackType | None) -> str | None:
    """'path/to/model.py:42 in forward: if x.sum() > 0:' for the innermost frame of ``tb`` outside torch and
    disco (the model's code where a data-dependent branch or a Proxy iteration stopped the tracer), or None."""
    site = None
    for frame in traceback.extract_tb(tb):
        if _outside(frame.filename):
            site = frame
    return None if site is None else _site(site.filename, site.lineno, site.name, site.line)


def caller_site() -> str | None:
    """The innermost frame of the current call stack in the model's code (a decomposition refusing a module
    while tracing: the line that called the module), as :func:`trace_site` writes it, or None."""
    site = None
    for frame in traceback.extract_stack():
        if _outside(frame.filename):
            site = frame
    return None if site is None else _site(site.filename, site.lineno, site.name, site.line)


def node_site(node: fx.Node) -> str | None:
    """The model's source line that made fx node ``node`` (recorded with ``record_stack_traces``), or None."""
    stack = node.meta.get("stack_trace")
    if not stack:
        return None
    site = None
    for m in _FRAME.finditer(stack):
        if _outside(m["file"]):
            site = m
    return None if site is None else _site(site["file"], site["line"], site["name"], site["code"])


def node_stack(node: fx.Node) -> str | None:
    """The model's part of the call stack that made ``node`` (its frames outside torch and disco), for ``-v``."""
    stack = node.meta.get("stack_trace")
    if not stack:
        return None
    frames = [m.group(0) for m in _FRAME.finditer(stack)
              if _outside(m["file"])]
    return "\n".join(f"  {f}" for f in frames) or None
