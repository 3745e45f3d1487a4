"""Run one rank's plan for one input: local compute, sends after producers, receives before consumers."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..graph import REPLICATED
from ..graph.ops import Flatten
from ..graph.types import shape_of
from .plan import MixPlan, RankPlan, local_shape

log = logging.getLogger(__name__)


class Handle(Protocol):
    def wait(self) -> Tensor: ...


class Transport(Protocol):
    """Point-to-point messages between nodes (see :mod:`disco.runtime.transport`)."""

    rank: int

    def send(self, tag: int, dst: int, t: Tensor, links: np.ndarray | None = None, coded: bool = True,
             stats: bool = False) -> None: ...

    def recv(self, tag: int, src: int, shape: tuple[int, ...], coded: bool = True) -> Handle: ...

    def flush(self) -> None: ...


class Executor:
    """Rank ``plan.rank``'s program over a transport, holding only its own weights."""

    def __init__(self, plan: RankPlan, gm: fx.GraphModule, weights: dict[str, Tensor], transport: Transport) -> None:
        self.plan, self.gm, self.w, self.tr = plan, gm, weights, transport
        self.record: dict[str, Tensor] | None = None  # when a dict: every local value computed (debugging)
        self.mods = plan.local_modules(gm, weights)
        self.recv_mods = plan.recv_modules(gm, weights)
        self.mix_modules = {ly.node: ly.view(gm) for ly in plan.part.layers}
        live = plan.liveness
        self.frees: dict[int, list[str]] = {}
        keep = set(plan.outputs)
        for name, last in live.last_use.items():
            if name not in keep:
                self.frees.setdefault(max(last, live.views_until.get(name, 0)), []).append(name)
        self.order = live.order
        out_ranks = {}
        for name in plan.outputs:
            own = plan.part.owner[name]
            out_ranks[name] = {j: torch.as_tensor(np.nonzero(own == j)[0]) for j in range(plan.part.nodes)}
        self.out_ranks = out_ranks
        reduces = [nd.name for nd in plan.graph_nodes if plan.part.op(nd.name).kind == "reduce"]
        self.stats_tags = {name: RankPlan.TAG_STATS + k for k, name in enumerate(reduces)}

    # ---- helpers --------------------------------------------------------------------------

    def _call(self, nd: fx.Node, args: tuple, kwargs: dict) -> Any:
        if nd.op == "call_module":
            mod = self.mods.get(nd.name)
            if mod is None:
                mod = self.gm.get_submodule(nd.target)
            return mod(*args, **kwargs)
        if nd.op == "call_function":
            return nd.target(*args, **kwargs)
        if nd.op == "call_method":
            return getattr(args[0], nd.target)(*args[1:], **kwargs)
        raise ValueError(f"cannot execute {nd.op} {nd.name}")

    def _recv_view(self, name: str, renv: dict[str, Tensor], pending: dict[str, list]) -> Tensor:
        if name in renv:
            return renv[name]
        plan = self.plan
        nd = plan.by_name[name]
        rule = plan.part.rules.get(name)
        if name in pending:  # a base tensor with channels arriving
            ex = plan.exchanges[name]
            parts = [h.wait() for _, h in pending.pop(name)]
            t = parts[0] if len(parts) == 1 else torch.cat(parts, ex.cdim)
            if len(parts) > 1:
                t = t.index_select(ex.cdim, ex.recv_perm)
            val = t
        elif name in plan.gather_recv:
            src, pos = plan.gather_recv[name]
            val = self._recv_view(src, renv, pending).index_select(plan.part.cdim[src], pos)
        elif name in plan.part.relayed:  # sent before this channel-local op: apply it to what arrived
            inplace = bool(nd.kwargs.get("inplace")) or str(nd.target).endswith("_")
            if nd.op == "call_module":
                mod = self.recv_mods.get(name) or self.gm.get_submodule(nd.target)
                inplace = inplace or bool(getattr(mod, "inplace", False))

            received: list[int] = []

            def arg(a: fx.Node) -> Any:
                if plan.part.owner.get(a.name) is None:
                    return self._env[a.name]
                v = self._recv_view(a.name, renv, pending)
                received.append(v.shape[plan.part.cdim[a.name]])
                return v.clone() if inplace else v  # the received view may feed other consumers

            args, kwargs = fx.node.map_arg((nd.args, nd.kwargs), arg)
            if received and not any(received):  # nothing arrived: some ops (interpolate) refuse empty input
                val = torch.zeros(local_shape(plan, name, 0))
            else:
                val = mod(*args, **kwargs) if nd.op == "call_module" else self._call(nd, args, kwargs)
        elif rule is not None and rule.kind == "view":
            if isinstance(rule, Flatten):
                src = next(a for a in nd.all_input_nodes if plan.part.owner.get(a.name) is not None)
                val = self._recv_view(src.name, renv, pending).reshape(local_shape(plan, name, len(plan.recv[name])))
            else:
                args, kwargs = fx.node.map_arg(
                    (nd.args, nd.kwargs),
                    lambda a: self._recv_view(a.name, renv, pending) if plan.part.owner.get(a.name) is not None
                    else self._env[a.name])
                val = self._call(nd, args, kwargs)
        else:
            val = torch.zeros(local_shape(plan, name, 0))
        renv[name] = val
        return val

    def _mixing(self, mp: MixPlan, x: Tensor, renv: dict[str, Tensor], pending: dict[str, list]) -> Tensor:
        m = self.mix_modules[mp.node]
        k = mp.kernel
        ys: list[Tensor | None] = []
        for b, blk in enumerate(mp.blocks):  # the local half: runs while remote channels are in flight
            wl = self.w[mp.weight_names(b)[0]]
            if blk.depthwise:
                ys.append(k.apply(m, x, wl, None, groups=x.shape[mp.in_cdim]))
            elif len(blk.loc):
                xl = x if len(blk.loc) == x.shape[mp.in_cdim] else x.index_select(mp.in_cdim, blk.loc)
                ys.append(k.apply(m, xl, wl, None))
            else:
                ys.append(None)
        if any(len(blk.rcv) for blk in mp.blocks):
            xr = self._recv_view(mp.input, renv, pending)
            for b, blk in enumerate(mp.blocks):
                if not len(blk.rcv):
                    continue
                xs = xr if len(blk.rcv) == xr.shape[mp.in_cdim] else xr.index_select(mp.in_cdim, blk.rcv)
                yr = k.apply(m, xs, self.w[mp.weight_names(b)[1]], None)
                ys[b] = yr if ys[b] is None else ys[b] + yr
        outs = []
        for blk, y in zip(mp.blocks, ys, strict=True):
            if y is None:
                y = torch.zeros(tuple(s if d != mp.out_cdim else blk.n_rows for d, s in enumerate(mp.out_shape)))
            outs.append(y)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, mp.out_cdim) if outs else torch.zeros(mp.out_shape)
        if mp.bias:
            shape = [1] * out.dim()
            shape[mp.out_cdim] = -1
            out = out + self.w[f"{mp.layer}.bias"].view(shape)
        return out

    def _reduce(self, nd: fx.Node, x: Tensor) -> Tensor:
        """A channel reduction (LayerNorm, L2 norm) over channels split across nodes, exact: every node
        sends its per-position statistics over its own channels to every other node; the rule combines them."""
        plan, tr = self.plan, self.tr
        rule = plan.part.rules[nd.name]
        mod = (self.mods.get(nd.name) or self.gm.get_submodule(nd.target)) if nd.op == "call_module" else None
        cdim = plan.part.cdim[nd.name]
        owner = plan.part.owner[nd.name]
        counts = torch.as_tensor(np.bincount(owner, minlength=plan.part.nodes), dtype=x.dtype)
        tag = self.stats_tags[nd.name]
        mine = rule.partial(x, cdim)
        handles = {j: tr.recv(tag, j, tuple(mine.shape), coded=False) for j in range(plan.part.nodes)
                   if j != plan.rank}
        for j in handles:
            tr.send(tag, j, mine, coded=False, stats=True)
        parts = {plan.rank: mine, **{j: h.wait() for j, h in handles.items()}}
        st = torch.stack([parts[j] for j in range(plan.part.nodes)])  # [N, ..., stats]
        return rule.finish(mod, nd, x, cdim, st, counts)

    # ---- one inference --------------------------------------------------------------------

    def run(self, inputs: list[Tensor] | None = None) -> Any:
        """Run one inference. The leader passes the inputs and gets the gathered output."""
        return self.start(inputs)()

    @torch.no_grad()
    def start(self, inputs: list[Tensor] | None = None, flush: bool = True) -> Any:
        """Run this rank's part of one inference; returns ``finish()`` that gathers the output (leader).

        With ``flush=False`` the sends may still be in flight when this returns (streaming)."""
        plan, tr = self.plan, self.tr
        leader = plan.rank == 0
        n = plan.part.nodes
        pending: dict[str, list] = {}
        for t, ex in plan.exchanges.items():  # post every receive up front
            if ex.recvs:
                pending[t] = [(s, tr.recv(ex.tag, s, ex.msg_shape(c))) for s, c in ex.recvs.items()]
        env: dict[str, Any] = dict(plan.fixed_args)
        self._env = env
        renv: dict[str, Tensor] = {}
        for k, name in enumerate(plan.inputs):
            if leader:
                x = inputs[k]
                for dst in range(1, n):
                    tr.send(RankPlan.TAG_INPUT, dst, x, coded=False)
            else:
                x = tr.recv(RankPlan.TAG_INPUT, 0, shape_of(plan.by_name[name]), coded=False).wait()
            env[name] = x
        for k, nd in enumerate(plan.graph_nodes):
            name = nd.name
            if nd.op in ("placeholder", "output"):
                pass
            elif nd.op == "get_attr":  # a mixing op's own weight is in its blocks, not here
                env[name] = None if name in plan.part.param_nodes else self.w[f"attr.{nd.target}"]
            elif name in plan.mix:
                mp = plan.mix[name]
                env[name] = self._mixing(mp, env[mp.input], renv, pending)
            elif name in plan.gather_local:
                src, pos = plan.gather_local[name]
                env[name] = env[src].index_select(plan.part.cdim[src], pos)
            else:
                rule = plan.part.rules.get(name)
                if rule is not None and rule.kind == "split":  # its pieces are gathers from its input
                    env[name] = None
                elif rule is not None and rule.kind == "reduce" and not (plan.part.owner[name] == REPLICATED).all():
                    env[name] = self._reduce(nd, env[nd.all_input_nodes[0].name])
                elif rule is not None and isinstance(rule, Flatten):
                    src = next(a for a in nd.all_input_nodes if plan.part.owner.get(a.name) is not None)
                    env[name] = env[src.name].reshape(local_shape(plan, name, len(plan.local[name])))
                else:
                    def get(a: fx.Node, name: str = name, conform: dict = plan.conform) -> Any:
                        v = env[a.name]
                        idx = conform.get((name, a.name))
                        return v if idx is None else v.index_select(plan.part.cdim[a.name], idx)

                    args, kwargs = fx.node.map_arg((nd.args, nd.kwargs), get)
                    env[name] = self._call(nd, args, kwargs)
            if self.record is not None and isinstance(env.get(name), Tensor):
                self.record[name] = env[name]
            ex = plan.sends_after.get(name)
            if ex is not None:
                v = env[name]
                for dst, idx in ex.sends.items():
                    tr.send(ex.tag, dst, v.index_select(ex.cdim, idx), links=ex.send_links[dst])
            for f in self.frees.get(k, ()):
                env.pop(f, None)
                renv.pop(f, None)
        for hs in pending.values():  # receives no op waited for (cannot happen with a consistent plan)
            for _, h in hs:
                h.wait()
        finish = self._gather(env)
        if flush:
            tr.flush()
        return finish

    def _gather(self, env: dict[str, Any]) -> Any:
        plan, tr = self.plan, self.tr
        leader = plan.rank == 0
        full: dict[str, Tensor] = {}
        for name in plan.outputs:
            own = plan.part.owner[name]
            cdim = plan.part.cdim[name]
            v = env[name]
            if not leader:
                idx = self.out_ranks[name][plan.rank]
                if len(idx) and not (own == REPLICATED).all():
                    pos = torch.as_tensor(np.searchsorted(plan.local[name], idx.numpy()))
                    tr.send(RankPlan.TAG_OUTPUT, 0, v.index_select(cdim, pos), coded=False)
                continue
            out = torch.empty(shape_of(plan.by_name[name]), dtype=v.dtype)
            out.index_copy_(cdim, torch.as_tensor(plan.local[name]), v)
            parts = []
            for j in range(1, plan.part.nodes):
                idx = self.out_ranks[name][j]
                if len(idx) and not (own == REPLICATED).all():
                    shp = list(out.shape)
                    shp[cdim] = len(idx)
                    parts.append((idx, tr.recv(RankPlan.TAG_OUTPUT, j, tuple(shp), coded=False)))
            full[name] = (out, cdim, parts)

        def finish() -> Any:
            if not leader:
                return None
            done = {}
            for name, (out, cdim, parts) in full.items():
                for idx, h in parts:
                    out.index_copy_(cdim, idx, h.wait())
                done[name] = out
            return fx.node.map_arg(plan.output_node.args[0], lambda a: done[a.name])

        return finish


def run_module(module: nn.Module, x: Tensor) -> Tensor:
    """Plain single-process inference (the baseline the runtime is compared against)."""
    with torch.no_grad():
        return module(x)
