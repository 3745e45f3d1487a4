"""Where op kinds are registered: by module type, by function, by method name; and the
decompositions the tracer applies to modules with internal structure (attention).

The op modules (:mod:`disco.graph.ops`) register themselves here when imported; the tracer and
the partitioner only look things up. Lookups by module type follow the MRO, but a subclass uses
its base's rule only when it does not redefine the base's forward (the rule's ``forward_names``):
timm's ``StdConv2d`` (a Conv2d that standardises its weights first) is refused by name instead of
being split as a plain convolution. Types and functions of optional packages (timm, torchvision)
may be registered by their ``"package.module.Name"``, without importing them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import fx

from .types import Rule

R = TypeVar("R")

_MODULE_RULES: dict[type | str, Rule] = {}
_FUNCTION_RULES: dict[Callable[..., Any] | str, Rule] = {}
_METHOD_RULES: dict[str, Rule] = {}
_DECOMPOSITIONS: dict[type, Callable[..., Any]] = {}
_TRACE_THROUGH: set[str] = set()


def _register(table: dict[Any, R], keys: tuple[Any, ...]) -> Callable[[R], R]:
    def deco(value: R) -> R:
        for k in keys:
            table[k] = value
        return value

    return deco


def qualname(obj: Any) -> str:
    """``package.module.QualName`` of a class or function (how optional packages' types are registered)."""
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', ''))}"


def register_module_rule(*types: type | str) -> Callable[[Rule], Rule]:
    """Register ``rule`` for module types, given as classes or ``"package.module.Class"`` names.
    Subclasses are covered only when they do not redefine the forward (see :func:`module_rule`)."""
    return _register(_MODULE_RULES, types)


def register_function_rule(*fns: Callable[..., Any] | str) -> Callable[[Rule], Rule]:
    """Register ``rule`` for functions called in the graph (``call_function`` nodes), given as objects or
    ``"package.module.function"`` names."""
    return _register(_FUNCTION_RULES, fns)


def register_method_rule(*names: str) -> Callable[[Rule], Rule]:
    """Register ``rule`` for tensor methods by name (``call_method`` nodes)."""
    return _register(_METHOD_RULES, names)


def register_decomposition(*types: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(module, *args, **kwargs)``: how the tracer sees a call of such a module."""
    return _register(_DECOMPOSITIONS, types)


def register_trace_through(*names: str) -> None:
    """Functions that their library hides from torch.fx (``torch.fx.wrap``: one opaque call in the graph) which
    the tracer traces through instead, given as ``"package.module.function"`` (torchvision's
    ``shifted_window_attention``): their tensor ops then meet the rules one by one."""
    _TRACE_THROUGH.update(names)


def traced_through() -> frozenset[str]:
    """The names registered with :func:`register_trace_through`."""
    return frozenset(_TRACE_THROUGH)


def _by_mro(table: dict[type, R], t: type) -> R | None:
    for cls in t.__mro__:
        if cls in table:
            return table[cls]
    return None


def _registered(t: type) -> tuple[type, Rule] | None:
    """The nearest class in ``t``'s MRO with a rule, and the rule."""
    for cls in t.__mro__:
        rule = _MODULE_RULES.get(cls) or _MODULE_RULES.get(qualname(cls))
        if rule is not None:
            return cls, rule
    return None


def _covers(rule: Rule, t: type, base: type) -> bool:
    """Does ``rule``, registered for ``base``, describe its subclass ``t`` (no redefined forward)?"""
    for cls in t.__mro__:
        if cls is base:
            return True
        if any(name in cls.__dict__ for name in rule.forward_names):
            return False
    return True


def module_rule(t: type) -> Rule | None:
    """The rule for module type ``t``: its own, or its nearest registered base's when ``t`` does not
    redefine any of that rule's ``forward_names``; else None."""
    hit = _registered(t)
    if hit is None:
        return None
    base, rule = hit
    return rule if base is t or _covers(rule, t, base) else None


def uncovered_base(t: type) -> type | None:
    """The registered base class of ``t`` whose rule does not cover it (``t`` redefines its forward)."""
    hit = _registered(t)
    return hit[0] if hit is not None and module_rule(t) is None else None


def decomposition(t: type) -> Callable[..., Any] | None:
    """The decomposition registered for module type ``t`` (or a base class of it), or None."""
    return _by_mro(_DECOMPOSITIONS, t)


def rule_for(node: fx.Node, gm: fx.GraphModule) -> Rule | None:
    """The rule for a call node, or None when there is none."""
    if node.op == "call_module":
        return module_rule(type(gm.get_submodule(node.target)))
    if node.op == "call_function":
        return _FUNCTION_RULES.get(node.target) or _FUNCTION_RULES.get(qualname(node.target))
    if node.op == "call_method":
        return _METHOD_RULES.get(node.target)
    return None
