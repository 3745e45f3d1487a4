"""Named points in a node's run where tests install behaviour (fault injection); empty in production.

The node calls :func:`fire` at ``"startup"`` (joined the store), ``"inference"`` (before timed inference
``k``) and ``"stream"`` (before streamed inference ``i``), with the rank. Nothing is registered unless
the environment variable ``DISCO_NODE_HOOKS`` names a module (``pkg.mod``) or a Python file; the node then
imports it once at start-up and calls its ``install_node_hooks(register)``. Production never sets it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import RefusedError

HOOKS_ENV = "DISCO_NODE_HOOKS"
POINTS = ("startup", "inference", "stream")

_HOOKS: dict[str, list[Callable[..., None]]] = {}


def register(point: str, fn: Callable[..., None]) -> None:
    """Call ``fn(**context)`` each time the node reaches ``point`` (one of :data:`POINTS`)."""
    if point not in POINTS:
        raise ValueError(f"unknown hook point {point!r}; known: {', '.join(POINTS)}")
    _HOOKS.setdefault(point, []).append(fn)


def fire(point: str, **context: Any) -> None:
    """Run the hooks installed at ``point`` (none in production)."""
    for fn in _HOOKS.get(point, ()):
        fn(**context)


def clear() -> None:
    """Remove every installed hook."""
    _HOOKS.clear()


def _import(name: str) -> Any:
    if name.endswith(".py") or os.sep in name:
        spec = importlib.util.spec_from_file_location("disco_node_hooks", name)
        if spec is None or spec.loader is None:
            raise ImportError(f"no such file {name}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(name)


def install_from_env() -> None:
    """Import the module that ``DISCO_NODE_HOOKS`` names, if set, and let it register its hooks."""
    name = os.environ.get(HOOKS_ENV)
    if not name:
        return
    try:
        mod = _import(name)
        mod.install_node_hooks(register)
    except Exception as e:
        raise RefusedError(f"{HOOKS_ENV}={name}: cannot install node hooks ({type(e).__name__}: {e})") from e
