"""Shared test helpers: the relative error of outputs, random BatchNorm statistics, and an independent
reference for the DISCO function (activation masking instead of weight masking).

The reference runs the graph once with the *unmasked* weights. At every mixing op, node j's output
channels are computed from the op's input with the channels j may not read zeroed,
and the output is assembled channel by channel from the node that owns each channel.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import fx

from disco.graph import REPLICATED, Partition


def rel_err(a: object, b: object) -> float:
    """max |a - b| / max |b| of two tensors, or the largest over the tensors of two outputs of the same
    structure (tuples, lists, dicts of tensors: a detector's per-level outputs)."""
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    assert len(la) == len(lb) and la, f"outputs with {len(la)} and {len(lb)} tensors"
    return max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-12)) for x, y in zip(la, lb, strict=True))


class _Assembled(fx.Interpreter):
    def __init__(self, part: Partition, gm: fx.GraphModule, kept: np.ndarray) -> None:
        super().__init__(gm)
        self.part = part
        self.layers = {ly.node: ly for ly in part.layers}
        self.kept = kept

    def run_node(self, n: fx.Node):  # noqa: ANN201
        ly = self.layers.get(n.name)
        if ly is None:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        x = args[0]
        in_cdim, out_cdim = self.part.cdim[ly.input], self.part.cdim[ly.node]
        allowed = ly.allowed(self.kept)
        owner = self.part.owner[ly.node]
        out = None
        for j in range(self.part.nodes):
            shape = [1] * x.dim()
            shape[in_cdim] = -1
            xj = x * torch.from_numpy(allowed[j]).view(shape).to(x.dtype)
            y = getattr(self, n.op)(n.target, (xj, *args[1:]), kwargs)
            if out is None:
                out = y.clone()
            idx = torch.from_numpy(np.nonzero((owner == j) | ((owner == REPLICATED) & (j == 0)))[0])
            out.index_copy_(out_cdim, idx, y.index_select(out_cdim, idx))
        return out


def reference_forward(part: Partition, plain_gm: fx.GraphModule, kept: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """The DISCO function computed by activation masking (for checking the weight masks)."""
    with torch.no_grad():
        return _Assembled(part, plain_gm, kept).run(x)


def randomize_bn(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random BatchNorm statistics and affine terms (so that no block is an identity); returns the model in eval."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.1, generator=g)
                m.running_var.uniform_(0.5, 2.0, generator=g)
                if m.affine:
                    m.weight.uniform_(0.5, 1.5, generator=g)
                    m.bias.normal_(0, 0.1, generator=g)
    return model.eval()


class StdConv(torch.nn.Conv2d):
    """A Conv2d subclass whose forward standardises its weights first (as timm's StdConv2d): swapped into a
    partitioned model, the model's own forward differs from what the partition read."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + 1e-5)
        return torch.nn.functional.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


def check_invariants(model: torch.nn.Module, x: torch.Tensor, nodes: int, keep: float = 0.4):
    """DESIGN.md's invariants 2-4 (and the masks) on random links: the masked model computes what nodes that
    see only their own and received channels compute, the simulated ranks compute it within 1e-4, the bytes
    sent are the cost model's, and each shard holds the weights the cost model counts. Returns the estimate."""
    import copy

    from disco.cost import estimate
    from disco.graph import partition
    from disco.graph.capture import capture
    from disco.masks import DiscoModel
    from disco.runtime.local import simulate
    from disco.runtime.plan import RankPlan

    plain = copy.deepcopy(model)
    part = partition(model, x, nodes)
    kept = np.random.default_rng(nodes).random(part.n_links) < keep
    dm = DiscoModel(model, part, kept).eval()
    with torch.no_grad():
        ref = dm(x)
        assert rel_err(ref, reference_forward(part, capture(plain, x), kept, x)) < 1e-5  # the masks
    out, trs = simulate(part, kept, x, timeout=20)
    assert rel_err(out, ref) < 1e-4  # invariant 2
    rep = estimate(part, kept)
    assert sum(t.payload_bytes for t in trs) == rep.bytes > 0  # invariant 3
    assert sum(t.stats_bytes for t in trs) == rep.stats_bytes  # channel reductions' statistics, counted apart
    params = [RankPlan(part, kept, j).shard_from(part.gm)[1] for j in range(nodes)]
    assert params == rep.params_per_node  # invariant 4
    return rep
