"""Exchange placement: a channel that reaches a mixing op through channel-local ops after a concatenation (or
through an upsampling) is sent before those ops and the receiver applies them; bytes counted by hand, invariants
2-4, and checkpoints/exports that record the placement they were made with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import randomize_bn
from torch import nn

from disco.cost import estimate
from disco.graph import partition
from disco.masks import DiscoModel
from disco.runtime.local import simulate
from disco.runtime.plan import RankPlan


class Dense(nn.Module):
    """A dense block (each layer: concatenation of all earlier features -> BN -> ReLU -> conv), a head on
    the last concatenation, an upsampling branch and a pooling branch."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.norms = nn.ModuleList([nn.BatchNorm2d(c) for c in (8, 12, 16, 20)])
        self.convs = nn.ModuleList([nn.Conv2d(c, 4, 3, padding=1) for c in (8, 12, 16)])
        self.head = nn.Conv2d(20, 6, 1)
        self.small = nn.Conv2d(6, 6, 1, stride=2)  # 8x8 -> 4x4
        self.up = nn.Conv2d(6, 5, 1)  # reads the small map upsampled back to 8x8
        self.pooled = nn.Conv2d(6, 5, 1)  # reads the head pooled to 4x4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [self.stem(x)]
        for norm, conv in zip(self.norms, self.convs, strict=False):
            feats.append(conv(F.relu(norm(torch.cat(feats, 1)), inplace=True)))
        h = self.head(torch.relu(self.norms[3](torch.cat(feats, 1))))
        u = self.up(F.relu(F.interpolate(self.small(h), size=h.shape[-2:], mode="nearest")))  # a static size
        p = self.pooled(F.max_pool2d(torch.relu(h), 2))
        return u.mean((2, 3)) + p.mean((2, 3))


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_bn(Dense())


def test_each_channel_crosses_once_counted_by_hand() -> None:
    model, plane, small = _model(), 8 * 8, 4 * 4
    after = estimate(partition(model, (1, 3, 8, 8), 2, relay=False))
    before = estimate(partition(model, (1, 3, 8, 8), 2))
    # sent where the mixing op reads: every layer's whole concatenation, the head's output (read by the
    # strided conv), the upsampled and the pooled maps
    assert after.dense_bytes == 4 * ((8 + 12 + 16 + 20) * plane + 6 * plane + 6 * plane + 6 * small)
    # sent before the channel-local ops: each concatenated feature once, the small map before upsampling
    # (the pooled map is cheaper after the pooling, and stays there)
    assert before.dense_bytes == 4 * ((8 + 4 + 4 + 4) * plane + 6 * plane + 6 * small + 6 * small)


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("frac", [1.0, 0.3])
def test_invariants_2_to_4_with_the_receiver_applying_the_ops(nodes: int, frac: float) -> None:
    model, x = _model(1), torch.randn(2, 3, 8, 8)
    part = partition(model, x, nodes)
    assert part.relayed  # the norms and ReLUs after the concatenations, the ReLU after the upsampling
    kept = np.random.default_rng(nodes).random(part.n_links) < frac
    dm = DiscoModel(model, part, kept).eval()
    with torch.no_grad():
        ref = dm(x)
    out, trs = simulate(part, kept, x, timeout=20)
    assert float((out - ref).abs().max() / ref.abs().max()) < 1e-4  # invariant 2
    rep = estimate(part, kept)
    assert sum(t.payload_bytes for t in trs) == rep.bytes > 0  # invariant 3
    shards = [RankPlan(part, kept, j).shard_from(part.gm) for j in range(nodes)]
    assert [n for _, n in shards] == rep.params_per_node  # invariant 4, receivers' norm parameters included
    assert any(k.startswith("recv.") and v.numel() for s, _ in shards for k, v in s.items())


def test_checkpoints_and_exports_record_the_placement(tmp_path: Path) -> None:
    from disco.loading import load, save_disco
    from disco.models import register_model
    from disco.runtime.export import export, load_node

    register_model("test_dense_placement")(Dense)
    for relay in (True, False):
        model = _model()
        part = partition(model, (1, 3, 8, 8), 2, relay=relay)
        dm = DiscoModel(model, part, np.random.default_rng(0).random(part.n_links) < 0.5)
        ck = save_disco(dm, tmp_path / f"c{relay}.safetensors", {"name": "test_dense_placement", "kwargs": {}})
        loaded = load(ck)
        assert loaded.partition.relay == relay and loaded.partition.fingerprint() == part.fingerprint()
        d = tmp_path / f"e{relay}"
        man = export(dm, part, dm.kept, d, {"name": "test_dense_placement", "kwargs": {}})
        assert man["placement"] == ("receiver" if relay else "sender")
        assert load_node(d, 1, 2).part.fingerprint() == part.fingerprint()
