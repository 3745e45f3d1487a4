"""Where op kinds are registered: by module type, by function, by method name; and the
decompositions the tracer applies to modules with internal structure (attention).

The op modules (:mod:`disco.graph.ops`) register themselves here when imported; the tracer and
the partitioner only look things up. Lookups by module type follow the MRO, so a subclass uses
its base's rule unless it has its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from torch import fx

if TYPE_CHECKING:
    from .rules import Rule

R = TypeVar("R")

_MODULE_RULES: dict[type, Rule] = {}
_FUNCTION_RULES: dict[Callable[..., Any], Rule] = {}
_METHOD_RULES: dict[str, Rule] = {}
_DECOMPOSITIONS: dict[type, Callable[..., Any]] = {}


def _register(table: dict[Any, R], keys: tuple[Any, ...]) -> Callable[[R], R]:
    def deco(value: R) -> R:
        for k in keys:
            table[k] = value
        return value

    return deco


def register_module_rule(*types: type) -> Callable[[Rule], Rule]:
    """Register ``rule`` for module types (subclasses inherit it unless they have their own)."""
    return _register(_MODULE_RULES, types)


def register_function_rule(*fns: Callable[..., Any]) -> Callable[[Rule], Rule]:
    """Register ``rule`` for functions called in the graph (``call_function`` nodes)."""
    return _register(_FUNCTION_RULES, fns)


def register_method_rule(*names: str) -> Callable[[Rule], Rule]:
    """Register ``rule`` for tensor methods by name (``call_method`` nodes)."""
    return _register(_METHOD_RULES, names)


def register_decomposition(*types: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(module, *args, **kwargs)``: how the tracer sees a call of such a module."""
    return _register(_DECOMPOSITIONS, types)


def _by_mro(table: dict[type, R], t: type) -> R | None:
    for cls in t.__mro__:
        if cls in table:
            return table[cls]
    return None


def module_rule(t: type) -> Rule | None:
    """The rule for module type ``t`` (or a base class of it), or None."""
    return _by_mro(_MODULE_RULES, t)


def decomposition(t: type) -> Callable[..., Any] | None:
    """The decomposition registered for module type ``t`` (or a base class of it), or None."""
    return _by_mro(_DECOMPOSITIONS, t)


def rule_for(node: fx.Node, gm: fx.GraphModule) -> Rule | None:
    """The rule for a call node, or None when there is none."""
    if node.op == "call_module":
        return module_rule(type(gm.get_submodule(node.target)))
    if node.op == "call_function":
        return _FUNCTION_RULES.get(node.target)
    if node.op == "call_method":
        return _METHOD_RULES.get(node.target)
    return None
