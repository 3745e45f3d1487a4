"""Run one rank's plan for one input: local compute, sends after producers, receives before consumers."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..graph.capture import shape_of
from ..graph.ops import Flatten
from ..schedule import Message, Run
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
    """Rank ``plan.rank``'s program over a transport, holding only its own weights: it executes the rank's
    schedule (:mod:`disco.schedule`) step by step."""

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
        steps = plan.schedule.steps
        self.remote = {s.node for s in steps if isinstance(s, Run) and s.half == "remote"}
        self.halves = {"all": self._node, "local": self._local, "remote": self._remote, "partial": self._partial,
                       "finish": self._finish}
        self.messages = {("send", "links"): self._send_links, ("recv", "links"): self._recv_links,
                         ("send", "stats"): self._send_stats, ("recv", "stats"): self._recv_stats,
                         ("send", "input"): self._send_input, ("recv", "input"): self._recv_input,
                         ("send", "output"): self._send_output, ("recv", "output"): self._recv_output}

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

    def _recv_view(self, name: str) -> Tensor:
        renv = self._renv
        if name in renv:
            return renv[name]
        plan = self.plan
        nd = plan.by_name[name]
        rule = plan.part.rules.get(name)
        if name in self._arrived:  # a base tensor whose channels arrived
            ex = plan.exchanges[name]
            got = self._arrived.pop(name)
            parts = [got[s] for s in sorted(got)]
            t = parts[0] if len(parts) == 1 else torch.cat(parts, ex.cdim)
            val = t.index_select(ex.cdim, ex.recv_perm) if len(parts) > 1 else t
        elif name in plan.gather_recv:
            src, pos = plan.gather_recv[name]
            val = self._recv_view(src).index_select(plan.part.cdim[src], pos)
        elif name in plan.part.relayed:  # sent before this channel-local op: apply it to what arrived
            val = self._relayed(nd)
        elif rule is not None and rule.kind == "view":
            if isinstance(rule, Flatten):
                src = next(a for a in nd.all_input_nodes if plan.part.owner.get(a.name) is not None)
                val = self._recv_view(src.name).reshape(local_shape(plan, name, len(plan.recv[name])))
            else:
                args, kwargs = fx.node.map_arg(
                    (nd.args, nd.kwargs),
                    lambda a: self._recv_view(a.name) if plan.part.owner.get(a.name) is not None else self._env[a.name])
                val = self._call(nd, args, kwargs)
        else:
            val = torch.zeros(local_shape(plan, name, 0))
        renv[name] = val
        return val

    def _relayed(self, nd: fx.Node) -> Tensor:
        """A relayed channel-local op applied to the channels this rank received."""
        plan = self.plan
        inplace = bool(nd.kwargs.get("inplace")) or str(nd.target).endswith("_")
        mod = None
        if nd.op == "call_module":
            mod = self.recv_mods.get(nd.name) or self.gm.get_submodule(nd.target)
            inplace = inplace or bool(getattr(mod, "inplace", False))
        received: list[int] = []

        def arg(a: fx.Node) -> Any:
            if plan.part.owner.get(a.name) is None:
                return self._env[a.name]
            v = self._recv_view(a.name)
            received.append(v.shape[plan.part.cdim[a.name]])
            return v.clone() if inplace else v  # the received view may feed other consumers

        args, kwargs = fx.node.map_arg((nd.args, nd.kwargs), arg)
        if received and not any(received):  # nothing arrived: some ops (interpolate) refuse empty input
            return torch.zeros(local_shape(plan, nd.name, 0))
        return mod(*args, **kwargs) if mod is not None else self._call(nd, args, kwargs)

    # ---- the halves of a run step ---------------------------------------------------------

    def _node(self, nd: fx.Node) -> Any:
        """An ordinary op on this rank's channels."""
        plan, env, name = self.plan, self._env, nd.name
        if nd.op == "get_attr":  # a mixing op's own weight is in its blocks, not here
            return None if name in plan.part.param_nodes else self.w[f"attr.{nd.target}"]
        if name in plan.gather_local:
            src, pos = plan.gather_local[name]
            return env[src].index_select(plan.part.cdim[src], pos)
        rule = plan.part.rules.get(name)
        if rule is not None and rule.kind == "split":  # its pieces are gathers from its input
            return None
        if rule is not None and isinstance(rule, Flatten):
            src = next(a for a in nd.all_input_nodes if plan.part.owner.get(a.name) is not None)
            return env[src.name].reshape(local_shape(plan, name, len(plan.local[name])))

        def get(a: fx.Node) -> Any:
            v = env[a.name]
            idx = plan.conform.get((name, a.name))
            return v if idx is None else v.index_select(plan.part.cdim[a.name], idx)

        args, kwargs = fx.node.map_arg((nd.args, nd.kwargs), get)
        return self._call(nd, args, kwargs)

    def _local(self, nd: fx.Node) -> Any:
        """The local half of a mixing op: runs while remote channels are in flight."""
        mp = self.plan.mix[nd.name]
        m, k, x = self.mix_modules[mp.node], mp.kernel, self._env[mp.input]
        ys: list[Tensor | None] = []
        for b, blk in enumerate(mp.blocks):
            wl = self.w[mp.weight_names(b)[0]]
            if blk.depthwise:
                ys.append(k.apply(m, x, wl, None, groups=x.shape[mp.in_cdim]))
            elif len(blk.loc):
                xl = x if len(blk.loc) == x.shape[mp.in_cdim] else x.index_select(mp.in_cdim, blk.loc)
                ys.append(k.apply(m, xl, wl, None))
            else:
                ys.append(None)
        if nd.name in self.remote:
            self._partial_out[nd.name] = ys
            return None
        return self._mix_out(mp, ys)

    def _remote(self, nd: fx.Node) -> Any:
        """The received half of a mixing op, added to its local half."""
        mp = self.plan.mix[nd.name]
        m, k = self.mix_modules[mp.node], mp.kernel
        ys = self._partial_out.pop(nd.name)
        xr = self._recv_view(mp.input)
        for b, blk in enumerate(mp.blocks):
            if not len(blk.rcv):
                continue
            xs = xr if len(blk.rcv) == xr.shape[mp.in_cdim] else xr.index_select(mp.in_cdim, blk.rcv)
            yr = k.apply(m, xs, self.w[mp.weight_names(b)[1]], None)
            ys[b] = yr if ys[b] is None else ys[b] + yr
        return self._mix_out(mp, ys)

    def _mix_out(self, mp: MixPlan, ys: list[Tensor | None]) -> Tensor:
        outs = [torch.zeros(tuple(s if d != mp.out_cdim else blk.n_rows for d, s in enumerate(mp.out_shape)))
                if y is None else y for blk, y in zip(mp.blocks, ys, strict=True)]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, mp.out_cdim) if outs else torch.zeros(mp.out_shape)
        if mp.bias:
            shape = [1] * out.dim()
            shape[mp.out_cdim] = -1
            out = out + self.w[f"{mp.layer}.bias"].view(shape)
        return out

    def _partial(self, nd: fx.Node) -> Any:
        """A channel reduction (LayerNorm, L2 norm) split across ranks, exact: this rank's per-position
        statistics over its own channels, which the stats messages exchange."""
        x = self._env[nd.all_input_nodes[0].name]
        self._stats[nd.name] = {self.plan.rank: self.plan.part.rules[nd.name].partial(x, self.plan.part.cdim[nd.name])}
        return None

    def _finish(self, nd: fx.Node) -> Any:
        plan = self.plan
        parts = self._stats.pop(nd.name)
        st = torch.stack([parts[j] for j in range(plan.part.nodes)])  # [N, ..., stats]
        counts = torch.as_tensor(np.bincount(plan.part.owner[nd.name], minlength=plan.part.nodes), dtype=st.dtype)
        mod = (self.mods.get(nd.name) or self.gm.get_submodule(nd.target)) if nd.op == "call_module" else None
        x = self._env[nd.all_input_nodes[0].name]
        return plan.part.rules[nd.name].finish(mod, nd, x, plan.part.cdim[nd.name], st, counts)

    # ---- messages -------------------------------------------------------------------------

    def _send_links(self, m: Message) -> None:
        ex = self.plan.exchanges[m.value]
        self.tr.send(m.tag, m.peer, self._env[m.value].index_select(m.axis, ex.sends[m.peer]),
                     links=ex.send_links[m.peer])

    def _recv_links(self, m: Message) -> None:
        self._arrived.setdefault(m.value, {})[m.peer] = self._posted.pop((m.tag, m.peer)).wait()

    def _send_stats(self, m: Message) -> None:
        self.tr.send(m.tag, m.peer, self._stats[m.value][self.plan.rank], coded=False, stats=True)

    def _recv_stats(self, m: Message) -> None:
        self._stats[m.value][m.peer] = self._posted.pop((m.tag, m.peer)).wait()

    def _send_input(self, m: Message) -> None:
        self.tr.send(m.tag, m.peer, self._env[m.value], coded=False)

    def _recv_input(self, m: Message) -> None:
        self._set(m.value, self.tr.recv(m.tag, m.peer, m.shape, coded=False).wait())

    def _set(self, name: str, val: Any) -> None:
        self._env[name] = val
        if self.record is not None and isinstance(val, Tensor):
            self.record[name] = val

    def _send_output(self, m: Message) -> None:
        pos = torch.as_tensor(np.searchsorted(self.plan.local[m.value], m.channels))
        self.tr.send(m.tag, m.peer, self._env[m.value].index_select(m.axis, pos), coded=False)

    def _recv_output(self, m: Message) -> None:
        h = self.tr.recv(m.tag, m.peer, m.shape, coded=False)
        self._gathered.append((m.value, m.axis, torch.as_tensor(m.channels), h))

    # ---- one inference --------------------------------------------------------------------

    def run(self, inputs: list[Tensor] | None = None) -> Any:
        """Run one inference. The leader passes the inputs and gets the gathered output."""
        return self.start(inputs)()

    @torch.no_grad()
    def start(self, inputs: list[Tensor] | None = None, flush: bool = True) -> Any:
        """Run this rank's part of one inference; returns ``finish()`` that gathers the output (leader).

        With ``flush=False`` the sends may still be in flight when this returns (streaming)."""
        plan = self.plan
        self._env = env = dict(plan.fixed_args)
        self._renv, self._arrived, self._stats, self._partial_out = {}, {}, {}, {}
        self._gathered: list[tuple[str, int, Tensor, Handle]] = []
        self._posted = {(m.tag, m.peer): self.tr.recv(m.tag, m.peer, m.shape, coded=m.kind == "links")
                        for m in plan.schedule.messages("recv") if m.kind in ("links", "stats")}  # up front
        if plan.rank == 0:
            for name, x in zip(plan.inputs, inputs or [], strict=True):
                self._set(name, x)
        freed = 0
        for st in plan.schedule.steps:
            if isinstance(st, Message):
                self.messages[(st.op, st.kind)](st)
                continue
            at = self.order[st.node]
            for k in range(freed, at):  # values last used before this node
                for f in self.frees.get(k, ()):
                    env.pop(f, None)
                    self._renv.pop(f, None)
            freed = max(freed, at)
            val = self.halves[st.half](plan.by_name[st.node])
            if st.half in ("all", "finish", "remote") or (st.half == "local" and st.node not in self.remote):
                self._set(st.node, val)
        finish = self._gather()
        if flush:
            self.tr.flush()
        return finish

    def _gather(self) -> Any:
        plan, env = self.plan, self._env
        if plan.rank != 0:
            return lambda: None
        full: dict[str, Tensor] = {}
        for name in plan.outputs:
            v = env[name]
            out = torch.empty(shape_of(plan.by_name[name]), dtype=v.dtype)
            out.index_copy_(plan.part.cdim[name], torch.as_tensor(plan.local[name]), v)
            full[name] = out
        gathered = self._gathered

        def finish() -> Any:
            for name, axis, idx, h in gathered:
                full[name].index_copy_(axis, idx, h.wait())
            return fx.node.map_arg(plan.output_node.args[0], lambda a: full[a.name])

        return finish


def run_module(module: nn.Module, x: Tensor) -> Tensor:
    """Plain single-process inference (the baseline the runtime is compared against)."""
    with torch.no_grad():
        return module(x)
