"""Capture a model as a torch.fx graph with the shape of every value."""

from __future__ import annotations

import inspect

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from ..errors import RefusedError
from .errors import UnsupportedOpError
from .registry import decomposition, module_rule, uncovered_base
from .tracesite import trace_site


class DiscoTracer(fx.Tracer):
    """Keeps torch.nn modules and every module type with a registered rule as leaves, and
    replaces modules with a registered decomposition (attention) by their decomposed calls."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        # a subclass that redefines a registered type's forward stays a leaf, so that it is refused by name
        t = type(m)
        return module_rule(t) is not None or uncovered_base(t) is not None or super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward, args, kwargs):  # noqa: ANN001,ANN201
        fn = decomposition(type(m))
        if fn is None:
            return super().call_module(m, forward, args, kwargs)
        return fn(m, *args, **kwargs)  # its submodule calls come back here


def capture(model: nn.Module, example: torch.Tensor) -> fx.GraphModule:
    """Trace ``model`` (leaf modules share their objects with ``model``) and record shapes."""
    tracer = DiscoTracer()
    tracer.record_stack_traces = True  # every node's source line, for refusals (errors.describe)
    # optional forward arguments (masks, flags) keep their defaults: the graph has one input
    params = list(inspect.signature(model.forward).parameters.values())[1:]
    concrete = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    try:
        graph = tracer.trace(model, concrete_args=concrete or None)
    except UnsupportedOpError:  # a decomposition refusing a use it does not cover: already clear
        raise
    except Exception as e:  # fx raises TraceError and friends for data-dependent control flow
        site = trace_site(e.__traceback__)
        at = f" at {site}" if site else ""
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RefusedError(
            f"cannot capture {type(model).__name__} as a graph with torch.fx{at} ({why}). "
            "Data-dependent control flow must live inside a leaf module with its own rule."
        ) from e
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    _share_attr_owners(gm, model)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        ShapeProp(gm).propagate(example)
    model.train(was_training)
    return gm


def _share_attr_owners(gm: fx.GraphModule, model: nn.Module) -> None:
    """Make the graph read parameters (``get_attr``) through the modules that own them.

    ``fx.GraphModule`` copies such a parameter onto an empty stand-in module; installing the
    real owner instead keeps the graph in step with later changes to it, e.g. the masks that
    parametrize ``in_proj_weight`` of a MultiheadAttention.
    """
    for node in gm.graph.nodes:
        path = node.target.rpartition(".")[0] if node.op == "get_attr" else ""
        if path and gm.get_submodule(path) is not model.get_submodule(path):
            gm.set_submodule(path, model.get_submodule(path))

