"""How the partitioner names an op it cannot split (the error type lives in :mod:`disco.errors`)."""

from __future__ import annotations

from torch import fx

from ..errors import UnsupportedOpError

__all__ = ["UnsupportedOpError", "describe", "unsupported"]


def describe(node: fx.Node, gm: fx.GraphModule) -> str:
    """'call_function torch.cat (node cat_1, module layer1.0)' for error messages."""
    if node.op == "call_module":
        what = f"module {type(gm.get_submodule(node.target)).__name__} at '{node.target}'"
    else:
        target = getattr(node.target, "__name__", str(node.target))
        mod = getattr(node.target, "__module__", None)
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()))[0] if stack else ""
        path = path if isinstance(path, str) else str(path)
        what = f"{node.op} {mod + '.' if mod and node.op == 'call_function' else ''}{target} " \
               f"(node '{node.name}', in module '{path or '<root>'}')"
    return what


def unsupported(node: fx.Node, gm: fx.GraphModule, why: str) -> UnsupportedOpError:
    """The error for ``node`` doing ``why`` (raise it)."""
    return UnsupportedOpError(f"{describe(node, gm)} {why}")
