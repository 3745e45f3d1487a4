"""Mixing ops: ops whose output channels read many input channels through a weight (the base of
convolutions and linear layers). A mixing op kind owns its weight layout (the [out, in] connection
matrix and back), the kernel a rank runs on its weight blocks, its shard of the weight and its cost."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..types import Builder, MixingLayer, OpCost, Rule, WeightView, tensor_args


def block_weight_names(key: str, block: int) -> tuple[str, str]:
    """The shard names of weight block ``block`` of layer ``key``: its local and its received columns."""
    return f"{key}.w{block}.local", f"{key}.w{block}.recv"


class Mixing(Rule):
    """An op whose output channels read many input channels through a weight.

    The weight is seen as an [out, in] connection matrix (groups give a block
    diagonal); :meth:`to_oi` and :meth:`from_oi` convert between the weight's
    layout and that matrix. Rules and kernels see the op through a :class:`WeightView`.
    """

    kind = "mixing"

    def weight_view(self, node: fx.Node, gm: fx.GraphModule) -> WeightView:
        """The module and parameter names that hold this op's weight and bias."""
        return WeightView(gm.get_submodule(node.target), node.target)

    def module_of(self, node: fx.Node, gm: fx.GraphModule) -> WeightView:
        """A mixing op's :meth:`infer` sees its weight through :meth:`weight_view`."""
        return self.weight_view(node, gm)

    def structure(self, module: nn.Module) -> tuple[int, int, int]:
        """(out channels, in channels, groups)."""
        raise NotImplementedError

    def out_cdim(self, b: Builder, node: fx.Node, x: fx.Node) -> int:
        return 1

    def macs_per_connection(self, b: Builder, node: fx.Node, x: fx.Node, module: nn.Module) -> int:
        raise NotImplementedError

    def to_oi(self, module: nn.Module, w: Tensor) -> Tensor:
        """A weight-shaped tensor reduced (summed) to the [out, in] connection matrix."""
        raise NotImplementedError

    def from_oi(self, module: nn.Module, m: Tensor) -> Tensor:
        """An [out, in] matrix expanded to the weight's shape."""
        raise NotImplementedError

    def infer(self, b: Builder, node: fx.Node, module: nn.Module | None) -> None:
        ins = tensor_args(node, b)
        if len(ins) != 1:
            b.unsupported(node, "mixing op with other than one feature-tensor input")
        x = ins[0]
        o, i, g = self.structure(module)
        if len(b.atoms[x]) != i:
            b.unsupported(node, f"expects {i} input channels along dim {b.cdim[x]}, got {b.shape(x)}")
        cdim = self.out_cdim(b, node, x)
        if i // g == 1 and not b.replicated(x):  # depthwise: output channel o reads input o // (o/g)
            b.set(node, b.atoms[x][np.arange(o) // (o // g)], cdim)
        else:
            b.set(node, b.new_atoms(o), cdim)

    # ---- weight layout ------------------------------------------------------------------------

    def weights_per_connection(self, module: nn.Module) -> int:
        """Weight entries behind one (output, input) connection: the kernel size (1 for a Linear)."""
        w = module.weight
        return math.prod(w.shape[2:]) if w.dim() > 2 else 1

    in_major = False  # the weight is [in, out/groups, ...] (a transposed convolution), not [out, in/groups, ...]

    def take(self, m: nn.Module, w: Tensor, rows: np.ndarray, cols: np.ndarray, group: int, og: int, ig: int
             ) -> Tensor:
        """The block of ``w`` for outputs ``rows`` and inputs ``cols`` (global channel indices, all in group
        ``group``): [rows x cols], or [cols x rows] for an input-major weight."""
        if self.in_major:
            return w[torch.as_tensor(cols)][:, torch.as_tensor(rows - group * og)]
        return w[torch.as_tensor(rows)][:, torch.as_tensor(cols - group * ig)]

    def take_depthwise(self, m: nn.Module, w: Tensor, rows: np.ndarray, ins: np.ndarray) -> Tensor:
        """The weight of a depthwise op for output channels ``rows`` (reading input channels ``ins``)."""
        return w[torch.as_tensor(ins if self.in_major else rows)]

    # ---- the kernel a rank runs -----------------------------------------------------------------

    def apply(self, m: nn.Module, x: Tensor, w: Tensor, bias: Tensor | None, groups: int = 1) -> Tensor:
        """This op on input ``x`` with the weight block ``w`` (the module ``m`` gives stride, padding...)."""
        raise NotImplementedError(f"{type(self).__name__} has no kernel: implement apply()")

    # ---- shard and cost: both walk the same blocks (MixingLayer.blocks) ------------------------------

    def shard(self, ly: MixingLayer, view: WeightView, kept: np.ndarray, rank: int) -> dict[str, Tensor]:
        """Rank ``rank``'s weight blocks of layer ``ly`` (named by :func:`block_weight_names`) and bias rows."""
        w = view.weight.detach()
        o, i, g = self.structure(view)
        out: dict[str, Tensor] = {}
        for b, blk in enumerate(ly.blocks(kept, rank)):
            wl, wr = block_weight_names(ly.key, b)
            if blk.depthwise:
                out[wl] = self.take_depthwise(view, w, blk.rows, blk.local).clone()
            else:
                out[wl] = self.take(view, w, blk.rows, blk.local, blk.group, o // g, i // g).clone()
                out[wr] = self.take(view, w, blk.rows, blk.received, blk.group, o // g, i // g).clone()
        if view.bias is not None:
            out[f"{ly.key}.bias"] = view.bias.detach()[torch.as_tensor(np.nonzero(ly.out_owner == rank)[0])].clone()
        return out

    def layer_cost(self, ly: MixingLayer, view: WeightView, kept: np.ndarray, ranks: int) -> OpCost:
        """FLOPs (2 x multiply-accumulates over the connections each rank computes; masked columns skipped)
        and weights per rank (the unmasked entries of its rows, and its bias entries)."""
        conns = np.array([sum(b.connections for b in ly.blocks(kept, j)) for j in range(ranks)], dtype=np.int64)
        params = conns * self.weights_per_connection(view)
        if view.bias is not None:
            params += np.bincount(ly.out_owner, minlength=ranks).astype(np.int64)
        return OpCost(flops=2 * ly.macs_per_connection * conns,
                      flops_dense=2 * ly.macs_per_connection * int(ly.structure().sum()), params=params)


    def link_cost(self, ly: MixingLayer, view: WeightView, n_links: int) -> tuple[np.ndarray, np.ndarray]:
        """[n_links] FLOPs and weights that each link brings to its receiving rank through layer ``ly``
        (the connections it feeds there: the received columns of the same blocks)."""
        every = np.ones(n_links, dtype=bool)
        count = np.zeros(n_links, dtype=np.int64)
        for j in range(ly.col_link.shape[0]):
            for blk in ly.blocks(every, j):
                np.add.at(count, ly.col_link[j, blk.received], len(blk.rows))
        return 2 * ly.macs_per_connection * count, count * self.weights_per_connection(view)

    def _group_cols(self, o: int, i: int, g: int) -> Tensor:
        """[o, i/g] index of the input channel each weight column reads."""
        return (torch.arange(o) // (o // g))[:, None] * (i // g) + torch.arange(i // g)[None, :]
