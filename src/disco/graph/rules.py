"""Compatibility: the op kinds now live in :mod:`disco.graph.ops` (one module per kind) and the
registries in :mod:`disco.graph.registry`. New code imports from there."""

from .ops import *  # noqa: F403
from .ops import __all__ as _ops_all
from .registry import (
    module_rule,
    register_function_rule,
    register_method_rule,
    register_module_rule,
    rule_for,
)

__all__ = [*_ops_all, "module_rule", "register_function_rule", "register_method_rule", "register_module_rule",
           "rule_for"]
