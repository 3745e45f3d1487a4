"""Capture a model as a torch.fx graph with the shape of every value."""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from ..errors import RefusedError
from .constants import fold_constants, makes_tensor, shape_only
from .errors import UnsupportedOpError
from .registry import decomposition, module_rule, traced_through, uncovered_base
from .tracesite import caller_site, trace_site
from .types import shape_of

log = logging.getLogger(__name__)


class DiscoTracer(fx.Tracer):
    """Keeps torch.nn modules and every module type with a registered rule as leaves, and
    replaces modules with a registered decomposition (attention) by their decomposed calls.

    A branch on sizes of the input (``if new_h != H``) is resolved for the shape of ``example`` (as
    torch.export does with static shapes): its value is computed on the example and the decision is recorded
    in :attr:`shape_guards` ('file:line: True'); a branch on the input's values is still refused."""

    def __init__(self, example: torch.Tensor | None = None) -> None:
        super().__init__()
        self.example = example
        self.shape_guards: list[str] = []
        self._known: dict[fx.Node, Any] = {}  # values on the example of the nodes traced so far, once computed

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _SizeProxy(node, self)

    def concrete(self, obj: fx.Proxy, why: str) -> int:
        """The value on the example of a size that Python needs as an int (a slice bound, ``range``), recorded
        like a branch; a value that depends on the input's values is refused."""
        if self.example is None or not shape_only(obj.node):
            raise fx.proxy.TraceError(f"a traced value used as {why} (it depends on the input's values)")
        value = int(self._value(obj.node))
        self.shape_guards.append(f"{caller_site() or obj.node.name} -> {why} {value}")
        return value

    def create_proxy(self, kind: str, target: Any, args: Any, kwargs: Any, *rest: Any, **kw: Any) -> Any:
        """A tensor made from sizes only (``x.new_zeros((H, W))``, ``torch.zeros(shape)``) is made at once, for the
        example's shape: the model's code may then write into it (Swin's shifted-window mask) and the graph
        holds it as a constant that every node holds whole."""
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **kw)
        if self.example is None or kind not in ("call_function", "call_method") or not makes_tensor(target) \
                or not shape_only(proxy.node):
            return proxy
        value = self._value(proxy.node)
        if not isinstance(value, torch.Tensor):
            return proxy
        self.graph.erase_node(proxy.node)
        return value

    def _value(self, node: fx.Node) -> Any:
        """``node``'s value on the example input (the graph traced so far, run up to ``node``)."""
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        g.graph_copy(self.graph, env)
        g.output(env[node])
        from torch.fx._symbolic_trace import _maybe_revert_all_patches  # the modules themselves, not the tracer

        with torch.no_grad(), _maybe_revert_all_patches():
            upto = fx.GraphModule(self.root, g)  # copies the parameters it reads: unpatched, so not as proxies
            upto.graph.eliminate_dead_code()
            upto.recompile()
            alive = set(upto.graph.nodes)
            known = {env[n]: v for n, v in self._known.items() if n in env and env[n] in alive}
            run = fx.Interpreter(upto, garbage_collect_values=False)
            out = run.run(self.example, initial_env=known)
        back = {new: old for old, new in env.items()}
        self._known.update({back[n]: v for n, v in run.env.items() if n in back})  # the next branch starts here
        return out

    def to_bool(self, obj: fx.Proxy) -> bool:
        if self.example is None or not shape_only(obj.node):
            return super().to_bool(obj)  # raises: data-dependent control flow
        value = bool(self._value(obj.node))
        site = caller_site()
        self.shape_guards.append(f"{site or obj.node.name} -> {value}")
        log.info("resolved a branch on the input's shape %s at %s: %s", tuple(self.example.shape), site, value)
        return value

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
    tracer = DiscoTracer(example)
    tracer.record_stack_traces = True  # every node's source line, for refusals (errors.describe)
    # optional forward arguments (masks, flags) keep their defaults: the graph has one input
    params = list(inspect.signature(model.forward).parameters.values())[1:]
    concrete = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    try:
        with _unwrapped(traced_through()):
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
    _forget_proxies(model)
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    gm.meta["shape_guards"] = list(tracer.shape_guards)
    _share_attr_owners(gm, model)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        ShapeProp(gm).propagate(example)
    signature = graph_signature(gm)  # before folding: a checkpoint's fingerprint names the graph as traced
    if fold_constants(gm, example):
        gm.meta["signature"] = signature
        with torch.no_grad():
            ShapeProp(gm).propagate(example)
    model.train(was_training)
    return gm


def graph_signature(gm: fx.GraphModule) -> list[str]:
    """'op|name|target|shape' of every node, as :meth:`~disco.graph.types.Partition.fingerprint` hashes them."""
    return [f"{n.op}|{n.name}|{re.sub(r' at 0x[0-9a-fA-F]+', '', str(n.target))}|{shape_of(n)}"
            for n in gm.graph.nodes]


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



class _SizeProxy(fx.Proxy):
    """A proxy that Python may use as an int where it is a size of the input (a slice bound, ``range(n)``)."""

    def __index__(self) -> int:
        return self.tracer.concrete(self, "an index")

    def __int__(self) -> int:
        return self.tracer.concrete(self, "an int")


def _forget_proxies(model: nn.Module) -> None:
    """Drop what tracing left in the modules' caches (timm's LeViT keeps ``attention_bias_cache[str(device)]``:
    a key made from a Proxy)."""
    for m in model.modules():
        for v in list(vars(m).values()):
            if isinstance(v, dict):
                for k in [k for k, x in v.items() if isinstance(x, fx.Proxy)]:
                    del v[k]


@contextlib.contextmanager
def _unwrapped(names: frozenset[str]) -> Iterator[None]:
    """While tracing, ``torch.fx.wrap`` does not hide the functions ``names`` (traced through instead)."""
    from torch.fx import _symbolic_trace as st

    table = st._wrapped_fns_to_patch
    hidden = {k: g for k, g in table.items() if f"{g.get('__name__')}.{k[1]}" in names}
    for k in hidden:
        del table[k]
    try:
        yield
    finally:
        table.update(hidden)
