"""Rank programs: what rank j (node j, one machine) computes, with which weight slices, and which
channels it sends and receives. In this module a *node* of the graph is an fx node (``nd``); machines
are ranks.

Rank j holds, of every feature tensor, its *local* channels (the ones it owns plus the
replicated ones), in channel order. It walks the captured graph in topological order:

* channel-local ops run on the local channels (parameters with one entry per channel are
  sliced to them by their op kind, :meth:`~disco.graph.ops.base.Rule.slice_param`);
* views (cat, flatten, identity) run on the local parts, which keeps channel order;
* a mixing op computes ``W_own @ x_own`` first, then waits for the channels it receives and
  adds ``W_recv @ x_recv`` (overlap of compute and communication); its weight blocks are
  :meth:`~disco.graph.partition.MixingLayer.blocks`, cut and run by its op kind
  (:meth:`~disco.graph.ops.mixing.Mixing.shard`, :meth:`~disco.graph.ops.mixing.Mixing.apply`).

Received channels are kept per *base tensor* (the tensor actually sent, see
``Partition.base``): a channel received once serves every consumer on the rank. The
*received view* of a tensor (its channels that rank j received, in order) is built by
replaying the same view ops on the received base tensors.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..graph import MixingLayer, Partition
from ..graph.liveness import liveness
from ..graph.ops import Mixing, block_weight_names, local_index
from ..graph.types import shape_of
from ..schedule import RankSchedule, build

log = logging.getLogger(__name__)


def module_tensors(m: nn.Module) -> list[tuple[str, Tensor, bool]]:
    """(name, tensor, is_parameter) of a module's own parameters and buffers."""
    out = [(n, p, True) for n, p in m.named_parameters(recurse=False)]
    out += [(n, b, False) for n, b in m.named_buffers(recurse=False) if b is not None]
    return out


# ---- the plan ---------------------------------------------------------------------------------

@dataclass
class Exchange:
    """The sends and receives of one base tensor on one node."""

    tensor: str
    tag: int
    cdim: int
    shape: tuple[int, ...]  # global shape of the base tensor
    sends: dict[int, Tensor] = field(default_factory=dict)  # dst -> positions in the local tensor
    send_links: dict[int, np.ndarray] = field(default_factory=dict)  # dst -> link ids
    recvs: dict[int, int] = field(default_factory=dict)  # src -> number of channels
    recv_links: dict[int, np.ndarray] = field(default_factory=dict)
    recv_perm: Tensor | None = None  # cat(messages in src order) -> channel order

    def msg_shape(self, n: int) -> tuple[int, ...]:
        s = list(self.shape)
        s[self.cdim] = n
        return tuple(s)


@dataclass
class Block:
    """One weight block of a mixing op on one rank: rows x (local cols, received cols)."""

    n_rows: int
    loc: Tensor  # positions in the local input
    rcv: Tensor  # positions in the received view of the input
    depthwise: bool = False


@dataclass
class MixPlan:
    layer: str
    node: str
    input: str
    out_cdim: int
    in_cdim: int
    kernel: Mixing  # the op kind: runs the blocks (apply)
    blocks: list[Block]
    bias: bool
    out_shape: tuple[int, ...]  # local output shape

    def weight_names(self, k: int) -> tuple[str, str]:
        return block_weight_names(self.layer, k)


def _shape_with(shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    s = list(shape)
    s[dim] = n
    return tuple(s)


def _positions(have: np.ndarray, want: np.ndarray, name: str) -> Tensor:
    """Positions of channels ``want`` in the sorted channel list ``have`` (all must be there)."""
    pos = np.searchsorted(have, want)
    if len(want) and (pos.max() >= len(have) or not np.array_equal(have[pos], want)):
        raise NotImplementedError(f"{name}: a channel selection reads channels this rank does not hold")
    return torch.as_tensor(pos, dtype=torch.long)


class RankPlan:
    """Everything rank ``rank`` needs to run its part of ``part`` with links ``kept``."""

    def __init__(self, part: Partition, kept: np.ndarray, rank: int, schedule: RankSchedule | None = None) -> None:
        self.part, self.rank, self.kept = part, rank, np.asarray(kept, dtype=bool)
        self.graph_nodes = list(part.gm.graph.nodes)
        self.by_name = {nd.name: nd for nd in self.graph_nodes}
        L = part.links
        # local channels and received channels of every tensor
        self.local: dict[str, np.ndarray] = {}
        self.recv: dict[str, np.ndarray] = {}
        masks = part.received_masks(self.kept, rank)
        for nd in self.graph_nodes:
            own = part.owner.get(nd.name)
            if own is None:
                continue
            self.local[nd.name] = local_index(own, rank)
            self.recv[nd.name] = part.received(nd.name, masks)
        # exchanges: the schedule's link messages, as positions in the local tensor and the received order
        self.schedule = schedule if schedule is not None else build(part, self.kept)[rank]
        self.exchanges: dict[str, Exchange] = {}
        for m in self.schedule.messages(kind="links"):
            ex = self.exchanges.setdefault(m.value, Exchange(m.value, m.tag, m.axis, shape_of(self.by_name[m.value])))
            if m.op == "send":
                ex.sends[m.peer] = torch.as_tensor(np.searchsorted(self.local[m.value], m.channels))
                ex.send_links[m.peer] = np.asarray(m.links, dtype=np.int64)
            else:
                ex.recvs[m.peer] = len(m.channels)
                ex.recv_links[m.peer] = np.asarray(m.links, dtype=np.int64)
        for ex in self.exchanges.values():
            order = [L.channel[ex.recv_links[s]] for s in sorted(ex.recvs)]
            if order:
                ex.recv_perm = torch.as_tensor(np.argsort(np.concatenate(order), kind="stable"))
        # mixing ops
        self.mix: dict[str, MixPlan] = {ly.node: self._mix_plan(ly) for ly in part.layers}
        # channel-local ops and reductions whose operands hold other channels than their output (a replicated
        # operand: F.group_norm's weight)
        self.conform: dict[tuple[str, str], Tensor] = {}
        for nd in self.graph_nodes:
            rule = part.rules.get(nd.name)
            if rule is None or rule.kind not in ("local", "reduce") or nd.name not in self.local:
                continue
            out_loc = self.local[nd.name]
            for a in nd.all_input_nodes:
                a_loc = self.local.get(a.name)
                if a_loc is None or len(part.owner[a.name]) != len(part.owner[nd.name]):
                    continue
                if not np.array_equal(a_loc, out_loc):
                    pos = np.searchsorted(a_loc, out_loc)
                    if np.any(pos >= len(a_loc)) or not np.array_equal(a_loc[np.minimum(pos, len(a_loc) - 1)],
                                                                     out_loc):
                        raise NotImplementedError(f"node {nd.name}: operand {a.name} lacks channels of the output")
                    self.conform[(nd.name, a.name)] = torch.as_tensor(pos)
        # channel selections and permutations: positions in the source's local and received channels
        self.gather_local: dict[str, tuple[str, Tensor]] = {}
        self.gather_recv: dict[str, tuple[str, Tensor]] = {}
        for name, (src, idx) in part.gathers.items():
            self.gather_local[name] = (src, _positions(self.local[src], idx[self.local[name]], name))
            self.gather_recv[name] = (src, _positions(self.recv[src], idx[self.recv[name]], name))
        # when every value is last needed, to free memory early
        self.liveness = liveness(part)
        self.last_use = self.liveness.last_use
        out_node = next(nd for nd in self.graph_nodes if nd.op == "output")
        self.outputs = [a.name for a in out_node.all_input_nodes if part.owner.get(a.name) is not None]
        self.output_node = out_node
        # the feature inputs; other placeholders are arguments fixed to their defaults when tracing
        self.inputs = [nd.name for nd in self.graph_nodes if nd.op == "placeholder" and shape_of(nd) is not None]
        self.fixed_args = {nd.name: (nd.args[0] if nd.args else None) for nd in self.graph_nodes
                           if nd.op == "placeholder" and shape_of(nd) is None}

    def _mix_plan(self, ly: MixingLayer) -> MixPlan:
        part, j = self.part, self.rank
        node = self.by_name[ly.node]
        loc_x, rcv_x = self.local[ly.input], self.recv[ly.input]
        blocks = [Block(len(b.rows), torch.as_tensor(np.arange(len(loc_x))), torch.zeros(0, dtype=torch.long),
                        depthwise=True) if b.depthwise else
                  Block(len(b.rows), torch.as_tensor(np.searchsorted(loc_x, b.local)),
                        torch.as_tensor(np.searchsorted(rcv_x, b.received)))
                  for b in ly.blocks(self.kept, j)]
        rows = int((ly.out_owner == j).sum())
        return MixPlan(
            layer=ly.key, node=ly.node, input=ly.input, out_cdim=part.cdim[ly.node], in_cdim=part.cdim[ly.input],
            kernel=ly.rule, blocks=blocks, bias=ly.view(part.gm).bias is not None,
            out_shape=_shape_with(shape_of(node), part.cdim[ly.node], rows)
        )

    # ---- weights --------------------------------------------------------------------------

    def shard_from(self, gm: fx.GraphModule) -> tuple[dict[str, Tensor], int]:
        """This rank's weights cut from a full model's graph module, and its parameter count."""
        part, j = self.part, self.rank
        out: dict[str, Tensor] = {}
        n_params = 0
        with torch.no_grad():
            for ly in part.layers:
                out.update(ly.rule.shard(ly, ly.view(gm), self.kept, j))
            n_params += sum(t.numel() for t in out.values())
            mixing = {ly.name for ly in part.layers}
            done: set[str] = set()
            for nd in self.graph_nodes:
                if nd.op != "call_module" or nd.target in mixing or nd.target in done:
                    continue
                done.add(nd.target)
                m = gm.get_submodule(nd.target)
                op, own = part.op(nd.name), part.owner.get(nd.name)
                for name, t, is_param in module_tensors(m):
                    t = op.shard_tensor(m, name, t.detach(), own, j)
                    out[f"{nd.target}.{name}"] = t.clone()
                    n_params += t.numel() if is_param else 0
            for nd, m, name, t, is_param in self._relayed_tensors(gm):  # for the channels this rank receives
                t = part.op(nd.name).slice_param(m, name, t.detach(), self.recv[nd.name], len(part.owner[nd.name]))
                out[f"recv.{nd.name}.{name}"] = t.clone()
                n_params += t.numel() if is_param else 0
            for nd in self.graph_nodes:
                if nd.op == "get_attr" and nd.name not in part.param_nodes:
                    t = _get_attr(gm, nd.target).detach()
                    out[f"attr.{nd.target}"] = t.clone()
                    n_params += t.numel() if isinstance(_get_attr(gm, nd.target), nn.Parameter) else 0
        return {k: v.contiguous() for k, v in out.items()}, n_params

    def _relayed_tensors(self, gm: fx.GraphModule) -> list[tuple[fx.Node, nn.Module, str, Tensor, bool]]:
        """Per-channel parameters and buffers of the relayed modules (exchange placement), which a
        receiver applies to the channels it receives: (node, module, name, tensor, is_parameter)."""
        out = []
        for nd in self.graph_nodes:
            if nd.name not in self.part.relayed or nd.op != "call_module":
                continue
            m = gm.get_submodule(nd.target)
            n_ch = len(self.part.owner[nd.name])
            out += [(nd, m, name, t, is_param) for name, t, is_param in module_tensors(m)
                    if t.dim() >= 1 and t.shape[0] == n_ch]
        return out

    def recv_modules(self, gm: fx.GraphModule, weights: dict[str, Tensor]) -> dict[str, nn.Module]:
        """Relayed modules (per call node) holding the parameters of the channels this rank receives."""
        import copy

        mods: dict[str, nn.Module] = {}
        for nd, m, name, _, is_param in self._relayed_tensors(gm):
            if nd.name not in mods:
                mods[nd.name] = copy.copy(m)
                mods[nd.name]._parameters = dict(m._parameters)
                mods[nd.name]._buffers = dict(m._buffers)
                for other, _, other_param in module_tensors(m):  # tensors not per channel: as the rank holds them
                    t = weights[f"{nd.target}.{other}"]
                    if other_param:
                        mods[nd.name]._parameters[other] = nn.Parameter(t, requires_grad=False)
                    else:
                        mods[nd.name]._buffers[other] = t
                mods[nd.name].eval()
            t = weights[f"recv.{nd.name}.{name}"]
            if is_param:
                mods[nd.name]._parameters[name] = nn.Parameter(t, requires_grad=False)
            else:
                mods[nd.name]._buffers[name] = t
        return mods

    def expected_shapes(self, gm: fx.GraphModule) -> dict[str, tuple[int, ...]]:
        """The tensor shapes of this rank's shard (computed on a meta-device model)."""
        return {k: tuple(v.shape) for k, v in self.shard_from(gm)[0].items()}

    def local_modules(self, gm: fx.GraphModule, weights: dict[str, Tensor]) -> dict[str, nn.Module]:
        """Channel-local modules (per call node) holding this rank's slices of their parameters."""
        import copy

        mods: dict[str, nn.Module] = {}
        mixing = {ly.name for ly in self.part.layers}
        built: dict[str, nn.Module] = {}
        for nd in self.graph_nodes:
            if nd.op != "call_module" or nd.target in mixing:
                continue
            if nd.target in built:
                mods[nd.name] = built[nd.target]
                continue
            m = gm.get_submodule(nd.target)
            tensors = module_tensors(m)
            if tensors:
                m = copy.copy(m)
                m._parameters = dict(m._parameters)
                m._buffers = dict(m._buffers)
                own = self.part.owner.get(nd.name)
                for name, _, is_param in tensors:
                    t = weights[f"{nd.target}.{name}"]
                    if own is not None:
                        t = self.part.op(nd.name).slice_param(m, name, t, self.local[nd.name], len(own))
                    if is_param:
                        m._parameters[name] = nn.Parameter(t, requires_grad=False)
                    else:
                        m._buffers[name] = t
            m.eval()
            built[nd.target] = m
            mods[nd.name] = m
        return mods


def _get_attr(gm: nn.Module, target: str) -> Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def local_shape(plan: RankPlan, name: str, n: int) -> tuple[int, ...]:
    return _shape_with(shape_of(plan.by_name[name]), plan.part.cdim[name], n)


def values_per_channel(plan: RankPlan, name: str) -> int:
    shp = shape_of(plan.by_name[name])
    return math.prod(shp) // shp[plan.part.cdim[name]]
