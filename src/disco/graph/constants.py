"""Values of the forward that do not depend on the input's values: tensors made from constants and shapes
(``torch.zeros``, ``arange``, position grids, ``x.new_zeros(...)``) and sizes computed from shapes.

The graph is specialised to the input shape it was captured with (the export records that shape and every
engine checks it at run): such a tensor is computed once at capture and becomes a buffer of the graph module
that every node holds whole (a replicated tensor); such a size becomes a literal, so a node never recomputes
it from its own slice of a tensor (``C // heads`` on a node that holds half the channels would differ).
Values computed from parameters are not folded (a later change of the weights must reach the graph); a
node computes them whole, from its copy of those parameters.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from torch import fx

log = logging.getLogger(__name__)

CONST, PARAM, DATA = 0, 1, 2  # depends on: nothing but shapes; parameters too; the input's values

_SHAPE_METHODS = {"size", "dim", "numel", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}
_SHAPE_ATTRS = {"shape", "ndim", "dtype", "device", "layout", "is_cuda"}
_SHAPE_FUNCTIONS = {torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like}
_RANDOM = ("rand", "bernoulli", "normal", "dropout", "multinomial", "poisson", "uniform", "exponential")
_VIEW_METHODS = {"view", "reshape", "expand", "flatten", "unflatten", "repeat", "permute", "transpose"}


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def classify(gm: fx.GraphModule) -> dict[fx.Node, int]:
    """CONST, PARAM or DATA for every node (see the module's docstring)."""
    cls: dict[fx.Node, int] = {}
    for nd in gm.graph.nodes:
        ins = [cls[a] for a in nd.all_input_nodes]
        worst = max(ins, default=CONST)
        if nd.op == "placeholder":
            c = DATA
        elif nd.op == "get_attr":
            c = PARAM
        elif nd.op == "output":
            c = worst
        elif any(k in _name(nd.target).lower() for k in _RANDOM):
            c = DATA
        elif nd.op == "call_method" and nd.target in _SHAPE_METHODS:
            c = max([cls[a] for a in nd.all_input_nodes[1:]], default=CONST)  # reads only the shape of self
        elif nd.op == "call_function" and nd.target is getattr and nd.args[1] in _SHAPE_ATTRS:
            c = CONST
        elif nd.op == "call_function" and nd.target in _SHAPE_FUNCTIONS:
            c = max([cls[a] for a in nd.all_input_nodes[1:]], default=CONST)
        elif nd.op == "call_module":
            c = max(worst, PARAM)
        else:
            c = worst
        cls[nd] = c
    return cls


def _foldable(value: Any) -> bool:
    """A value that can stand in the graph as a buffer or a literal."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (bool, int, float)):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float)) for v in value)


def fold_constants(gm: fx.GraphModule, example: torch.Tensor) -> int:
    """Replace the CONST values that DATA or PARAM ops read by buffers (tensors) and literals (sizes), for the
    shape of ``example``. Sizes that only a reshape reads stay (its node reshapes by the recorded shape).
    Returns how many values were folded."""
    cls = classify(gm)
    roots = []
    for nd in gm.graph.nodes:
        if cls[nd] != CONST or nd.op not in ("call_function", "call_method"):
            continue
        readers = [u for u in nd.users if cls[u] != CONST]
        if not readers:
            continue
        if nd.op == "call_function" and nd.target is getattr and nd.args[1] in ("dtype", "device", "layout"):
            continue  # the same on every node
        if not _is_tensor_op(nd) and all(u.op == "call_method" and u.target in _VIEW_METHODS
                                         or u.target in (torch.reshape, torch.flatten) for u in readers):
            continue
        roots.append(nd)
    if not roots:
        return 0
    want = set(roots)
    values: dict[fx.Node, Any] = {}

    class _Rec(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            if n in want:
                values[n] = out
            return out

    with torch.no_grad():
        _Rec(gm).run(example)
    done = 0
    for k, nd in enumerate(roots):
        v = values.get(nd)
        if not _foldable(v):
            continue
        if isinstance(v, torch.Tensor):
            name = f"_disco_const_{k}"
            gm.register_buffer(name, v.detach().clone(), persistent=False)
            with gm.graph.inserting_before(nd):
                new = gm.graph.get_attr(name)
            new.meta.update(nd.meta)
            nd.replace_all_uses_with(new)
        else:
            lit = tuple(v) if isinstance(v, (tuple, list)) else v
            for u in list(nd.users):
                u.args = fx.node.map_arg(u.args, lambda a, nd=nd, lit=lit: lit if a is nd else a)
                u.kwargs = fx.node.map_arg(u.kwargs, lambda a, nd=nd, lit=lit: lit if a is nd else a)
        done += 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    log.info("folded %d values that do not depend on the input's values (shapes of %s)", done,
             tuple(example.shape))
    return done


def _is_tensor_op(nd: fx.Node) -> bool:
    """Does ``nd`` make a tensor (not a size)? Judged by its target, before any value is known."""
    if nd.op == "call_method":
        return nd.target.startswith("new_") or nd.target not in ("size", "dim", "numel")
    return nd.target not in (getattr, operator.getitem, operator.add, operator.sub, operator.mul,
                             operator.floordiv, operator.truediv, operator.mod, operator.pow, operator.neg)


_CREATORS = {"zeros", "ones", "full", "empty", "arange", "linspace", "eye", "zeros_like", "ones_like", "full_like",
             "empty_like", "tensor", "as_tensor", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}


def makes_tensor(target: Any) -> bool:
    """Is ``target`` a tensor factory (``torch.zeros``, ``arange``, ``x.new_zeros``...)?"""
    return _name(target) in _CREATORS and (isinstance(target, str) or getattr(target, "__module__", "") in (
        "torch", "torch._C._VariableFunctions", None) or target in _SHAPE_FUNCTIONS or hasattr(torch, _name(target)))


def shape_only(node: fx.Node) -> bool:
    """Does ``node``'s value depend on no value of the input and no parameter (only on shapes)?"""
    seen: dict[fx.Node, int] = {}

    def walk(n: fx.Node) -> int:
        if n in seen:
            return seen[n]
        if n.op == "placeholder":
            c = DATA
        elif n.op == "get_attr":
            c = PARAM
        elif n.op == "call_method" and n.target in _SHAPE_METHODS:
            c = max([walk(a) for a in n.all_input_nodes[1:]], default=CONST)
        elif n.op == "call_function" and n.target is getattr and n.args[1] in _SHAPE_ATTRS:
            c = CONST
        elif n.op == "call_module":
            c = DATA
        else:
            c = max([walk(a) for a in n.all_input_nodes], default=CONST)
        seen[n] = c
        return c

    return walk(node) == CONST
