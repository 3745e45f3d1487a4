"""Run one rank's plan for one input: local compute, sends after producers, receives before consumers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..graph.ops import Flatten
from ..schedule import Message, Run, cuts, env_key
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
        self.local_input: Tensor | None = None  # set: every node has the input (``--input-at every-node``)
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
                       "finish": self._finish, "gather": self._gather_out}
        self.cuts = cuts(steps)
        # the leader's output gather (its recvs and "gather" runs) happens in finish(), after the rest
        out = [i for i, s in enumerate(steps) if isinstance(s, Message) and s.op == "recv" and s.kind == "output"]
        out += [i for i, s in enumerate(steps) if isinstance(s, Run) and s.half == "gather"]
        self.tail = min(out, default=len(steps))
        self._out_recvs: dict[str, list[Message]] = {}
        for i in out:
            if isinstance(steps[i], Message):
                self._out_recvs.setdefault(steps[i].value, []).append(steps[i])
        self._freed = 0
        self.env_factory: Callable[[dict[str, Any]], dict[str, Any]] = dict  # the environment's type

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
        """The channels of ``name`` this rank received, in channel order (``name@recv`` in the environment)."""
        env = self._env
        if f"{name}@recv" in env:
            return env[f"{name}@recv"]
        plan = self.plan
        nd = plan.by_name[name]
        rule = plan.part.rules.get(name)
        ex = plan.exchanges.get(name)
        if ex is not None and ex.recvs:  # a base tensor whose channels arrived
            parts = [env.pop(f"{name}@links:{s}>{plan.rank}") for s in sorted(ex.recvs)]
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
        env[f"{name}@recv"] = val
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
        if nd.op == "get_attr":
            return self._attr(nd)
        if name in plan.gather_local:
            src, pos = plan.gather_local[name]
            return env[src].index_select(plan.part.cdim[src], pos)
        rule = plan.part.rules.get(name)
        if rule is not None and rule.kind == "split":  # its pieces are gathers from its input
            return None
        if rule is not None and isinstance(rule, Flatten):
            src = next(a for a in nd.all_input_nodes if plan.part.owner.get(a.name) is not None)
            return env[src.name].reshape(local_shape(plan, name, len(plan.local[name])))

        args, kwargs = fx.node.map_arg((nd.args, nd.kwargs), lambda a: self._operand(name, a))
        return self._call(nd, args, kwargs)

    def _attr(self, nd: fx.Node) -> Tensor | None:
        """The tensor of a ``get_attr`` node (a mixing op's own weight is in its blocks, not here)."""
        return None if nd.name in self.plan.part.param_nodes else self.w[f"attr.{nd.target}"]

    def _operand(self, name: str, a: fx.Node) -> Any:
        """Operand ``a`` of op ``name`` as this rank holds it, cut to the op's channels where it holds more
        (a replicated per-channel weight: :attr:`RankPlan.conform`). A weight is read from the rank's weights,
        not the environment (in an ONNX export it is a constant of the segment that reads it)."""
        v = self._attr(a) if a.op == "get_attr" else self._env[a.name]
        idx = self.plan.conform.get((name, a.name))
        return v if idx is None else v.index_select(self.plan.part.cdim[a.name], idx)

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
            self._env.update({f"{nd.name}@local{b}": y for b, y in enumerate(ys) if y is not None})
            return None
        return self._mix_out(mp, ys)

    def _remote(self, nd: fx.Node) -> Any:
        """The received half of a mixing op, added to its local half."""
        mp = self.plan.mix[nd.name]
        m, k = self.mix_modules[mp.node], mp.kernel
        ys = [self._env.pop(f"{nd.name}@local{b}", None) for b in range(len(mp.blocks))]
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
        self._env[f"{nd.name}@stats"] = self.plan.part.rules[nd.name].partial(x, self.plan.part.cdim[nd.name])
        return None

    def _finish(self, nd: fx.Node) -> Any:
        plan, env, j = self.plan, self._env, self.plan.rank
        parts = [env.pop(f"{nd.name}@stats" if k == j else f"{nd.name}@stats:{k}>{j}") for k in range(plan.part.nodes)]
        st = torch.stack(parts)  # [N, ..., stats]
        counts = torch.as_tensor(np.bincount(plan.part.owner[nd.name], minlength=plan.part.nodes), dtype=st.dtype)
        rule = plan.part.rules[nd.name]
        if nd.op == "call_module":
            mod = self.mods.get(nd.name) or self.gm.get_submodule(nd.target)
        else:  # a function: what the rule reads of its arguments on this rank (F.group_norm's weight)
            mod = rule.function_module(nd, *fx.node.map_arg((nd.args, nd.kwargs), lambda a: self._operand(nd.name, a)))
        x = self._env[nd.all_input_nodes[0].name]
        return rule.finish(mod, nd, x, plan.part.cdim[nd.name], st, counts)

    def _gather_out(self, nd: fx.Node) -> Any:
        """The leader's whole output ``name@full``: its own channels and the received ones, in channel order."""
        plan, name = self.plan, nd.name
        parts, chans = [self._env[name]], [plan.local[name]]
        for m in self._out_recvs.get(name, ()):
            parts.append(self._env.pop(env_key(m, 0)))
            chans.append(np.asarray(m.channels))
        if len(parts) == 1:
            return parts[0]
        perm = torch.as_tensor(np.argsort(np.concatenate(chans), kind="stable"))
        return torch.cat(parts, plan.part.cdim[name]).index_select(plan.part.cdim[name], perm)

    # ---- messages -------------------------------------------------------------------------

    def _cut(self, m: Message) -> None:
        """Put the exact message of a link or output send in the environment (``env_key``)."""
        pos = self.plan.exchanges[m.value].sends[m.peer] if m.kind == "links" else \
            torch.as_tensor(np.searchsorted(self.plan.local[m.value], m.channels))
        self._env[env_key(m, self.plan.rank)] = self._env[m.value].index_select(m.axis, pos)

    def _ship(self, m: Message) -> None:
        key = env_key(m, self.plan.rank)
        if m.kind == "input" and self.local_input is not None:  # every node reads the input itself
            if m.op == "recv":
                self._set(key, self.local_input)
            return
        if m.op == "send":
            links = self.plan.exchanges[m.value].send_links[m.peer] if m.kind == "links" else None
            v = self._env.pop(key) if m.kind in ("links", "output") else self._env[key]
            self.tr.send(m.tag, m.peer, v, links=links, coded=m.kind == "links", stats=m.kind == "stats")
        elif m.kind in ("links", "stats"):  # posted up front
            self._set(key, self._posted.pop((m.tag, m.peer)).wait())
        elif m.kind == "input":
            self._set(key, self.tr.recv(m.tag, m.peer, m.shape, coded=False).wait())
        else:  # the output: posted in start(), waited for when the leader gathers (finish)
            self._set(key, self._handles.pop(key).wait())

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
        self._env = self.env_factory(plan.fixed_args)
        self._handles = {env_key(m, 0): self.tr.recv(m.tag, m.peer, m.shape, coded=False)
                         for ms in self._out_recvs.values() for m in ms}
        self._posted = {(m.tag, m.peer): self.tr.recv(m.tag, m.peer, m.shape, coded=m.kind == "links")
                        for m in plan.schedule.messages("recv") if m.kind in ("links", "stats")}  # up front
        if plan.rank == 0:
            for name, x in zip(plan.inputs, inputs or [], strict=True):
                self._set(name, x)
        self._freed = 0
        for m in self.cuts.get(-1, ()):
            self._cut(m)
        for i in range(self.tail):
            self.step(i)
        if flush:
            self.tr.flush()
        env, handles = self._env, self._handles  # this inference's (streaming starts the next before finish)
        return lambda: self._finish_gather(env, handles)

    def step(self, i: int) -> None:
        """Execute step ``i`` of the schedule (a send's cut happens with the run before it: :attr:`cuts`)."""
        st = self.plan.schedule.steps[i]
        if isinstance(st, Message):
            self._ship(st)
            return
        at = self.order[st.node]
        for k in range(self._freed, at):  # values last used before this node
            for f in self.frees.get(k, ()):  # dict.pop: a free is not a read (see runtime.onnx_export)
                dict.pop(self._env, f, None)
                dict.pop(self._env, f"{f}@recv", None)
        self._freed = max(self._freed, at)
        val = self.halves[st.half](self.plan.by_name[st.node])
        if st.half == "gather":
            self._env[f"{st.node}@full"] = val
        elif st.half in ("all", "finish", "remote") or (st.half == "local" and st.node not in self.remote):
            self._set(st.node, val)
        for m in self.cuts.get(i, ()):
            self._cut(m)

    def _finish_gather(self, env: dict[str, Any], handles: dict[str, Handle]) -> Any:
        """The leader: wait for the output parts and assemble the output (others: None)."""
        plan = self.plan
        if plan.rank != 0:
            return None
        self._env, self._handles = env, handles
        for i in range(self.tail, len(plan.schedule.steps)):
            self.step(i)
        return fx.node.map_arg(plan.output_node.args[0], lambda a: self._env[f"{a.name}@full"])


def run_module(module: nn.Module, x: Tensor) -> Tensor:
    """Plain single-process inference (the baseline the runtime is compared against)."""
    with torch.no_grad():
        return module(x)
