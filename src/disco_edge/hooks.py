"""Optional fault-injection points (tests, ``bench/faults.py``); nothing runs unless ``DISCO_NODE_HOOKS`` is set.

``DISCO_NODE_HOOKS`` names a Python file that defines ``install_node_hooks(register)``, as for the torch node;
``register(point, fn)`` makes the node call ``fn(rank=R)`` at ``"startup"`` (the peers met) and
``fn(rank=R, k=K)`` before inference ``K`` after the self-test (warm-up included, from 0; on every rank) and,
``fn(rank=R, i=I)`` before inference ``I`` of the stream (``--stream``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable

from .errors import Refused

HOOKS_ENV = "DISCO_NODE_HOOKS"
POINTS = ("startup", "inference", "stream")
Hooks = dict[str, list[Callable[..., None]]]


def from_env() -> Hooks:
    """The hooks the file named by ``DISCO_NODE_HOOKS`` registers ({} when unset: production)."""
    hooks: Hooks = {}
    name = os.environ.get(HOOKS_ENV)
    if not name:
        return hooks

    def register(point: str, fn: Callable[..., None]) -> None:
        if point not in POINTS:
            raise ValueError(f"the onnxruntime engine has no hook point {point!r} (it has {', '.join(POINTS)})")
        hooks.setdefault(point, []).append(fn)

    try:
        spec = importlib.util.spec_from_file_location("disco_node_hooks", name)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = mod  # type: ignore[union-attr]  # dataclasses look their module up there
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        mod.install_node_hooks(register)
    except Exception as e:
        raise Refused(f"{HOOKS_ENV}={name}: cannot install node hooks ({type(e).__name__}: {e})") from None
    return hooks
