"""How the partitioner names an op it cannot split (the error type lives in :mod:`disco.errors`): the op, its
module path and the file:line of the model's source that made it, in one line; the model's part of the call
stack rides along as a note (``disco -v`` prints it with the traceback)."""

from __future__ import annotations

from torch import fx

from ..errors import UnsupportedOpError
from .tracesite import node_site, node_stack

__all__ = ["UnsupportedOpError", "describe", "refusal", "unsupported"]


def describe(node: fx.Node, gm: fx.GraphModule) -> str:
    """'call_function torch.cat (node cat_1, in module layer1.0, at model.py:42 in forward: ...)'."""
    site = node_site(node)
    at = f", at {site}" if site else ""
    if node.op == "call_module":
        return f"module {type(gm.get_submodule(node.target)).__name__} at '{node.target}'" + (
            f" ({at[2:]})" if site else "")
    target = getattr(node.target, "__name__", str(node.target))
    mod = getattr(node.target, "__module__", None)
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    path = path if isinstance(path, str) else str(path)
    return f"{node.op} {mod + '.' if mod and node.op == 'call_function' else ''}{target} " \
           f"(node '{node.name}', in module '{path or '<root>'}'{at})"


def refusal(node: fx.Node, message: str) -> UnsupportedOpError:
    """An :class:`UnsupportedOpError` with ``message``, carrying the model's call stack of ``node`` as a note."""
    e = UnsupportedOpError(message)
    stack = node_stack(node)
    if stack:
        e.add_note(f"the model's source that made node '{node.name}' (innermost last):\n{stack}")
    return e


def unsupported(node: fx.Node, gm: fx.GraphModule, why: str) -> UnsupportedOpError:
    """The error for ``node`` doing ``why`` (raise it)."""
    return refusal(node, f"{describe(node, gm)} {why}")
