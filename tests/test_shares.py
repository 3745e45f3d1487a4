"""Unequal nodes (``shares``): ownership in proportion, and invariants 1-4 at N=2 shares 2,1 and N=3 shares 3,2,1."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reference import randomize_bn, rel_err

from disco.cost import estimate
from disco.graph import partition
from disco.graph.partition import share_sizes, split_owner
from disco.loading import load, save_disco
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.export import export, meta_partition
from disco.runtime.launch import launch
from disco.runtime.local import simulate

CASES = [(2, (2.0, 1.0)), (3, (3.0, 2.0, 1.0))]


def test_share_sizes() -> None:
    assert share_sizes(10, 3) == [4, 3, 3] and split_owner(10, 3).tolist() == [0] * 4 + [1] * 3 + [2] * 3
    assert share_sizes(16, 2, (2, 1)) == [11, 5]  # 10.67 + 5.33: the larger remainder gets the channel
    assert share_sizes(12, 3, (3, 2, 1)) == [6, 4, 2]
    assert share_sizes(3, 3, (100, 1, 1)) == [1, 1, 1]  # every node keeps a channel
    with pytest.raises(ValueError, match="3 entries"):
        partition(build_model("cifar_resnet8"), (1, 3, 32, 32), 2, (3, 2, 1))
    with pytest.raises(ValueError, match="positive"):
        partition(build_model("cifar_resnet8"), (1, 3, 32, 32), 2, (1, 0))


def test_equal_shares_are_the_default_split() -> None:
    m = build_model("cifar_resnet8")
    a, b = partition(m, (1, 3, 32, 32), 2), partition(m, (1, 3, 32, 32), 2, (1.5, 1.5))
    assert b.shares is None and a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize("name", ["cifar_resnet8", "vit_tv_test"])
@pytest.mark.parametrize("n,shares", CASES)
def test_invariants_with_shares(name: str, n: int, shares: tuple[float, ...]) -> None:
    torch.manual_seed(0)
    model = randomize_bn(build_model(name).eval())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
    part = partition(model, x, n, shares)
    # every mixing layer's outputs are split in proportion (within one channel, or one head for attention)
    for ly in part.layers:
        counts = np.bincount(ly.out_owner, minlength=n)
        if len(ly.out_owner) >= 8 * n and "attn" not in ly.name:
            assert np.allclose(counts / counts.sum(), np.array(shares) / sum(shares), atol=1.5 / counts.sum())
    dm = DiscoModel(model, part).eval()
    with torch.no_grad():
        assert rel_err(dm(x), ref) < 1e-5  # invariant 1: every link kept == the original
    kept = np.random.default_rng(n).random(part.n_links) < 0.3
    dm.set_kept(kept)
    with torch.no_grad():
        disco = dm(x)
    out, trs = simulate(part, kept, x, timeout=20)
    assert rel_err(out, disco) < 1e-4  # invariant 2 (node plans as threads)
    rep = estimate(part, kept)
    assert sum(t.payload_bytes for t in trs) == rep.bytes  # invariant 3
    assert sum(rep.bytes_sent_per_node) == sum(rep.bytes_received_per_node) == rep.bytes
    sent = [t.payload_bytes for t in trs]
    assert sent == rep.bytes_sent_per_node


@pytest.mark.parametrize("n,shares", CASES)
def test_export_and_processes_with_shares(tmp_path, n: int, shares: tuple[float, ...]) -> None:
    torch.manual_seed(0)
    model = randomize_bn(build_model("cifar_resnet8").eval())
    part = partition(model, (1, 3, 32, 32), n, shares)
    kept = np.random.default_rng(0).random(part.n_links) < 0.3
    dm = DiscoModel(model, part, kept).eval()
    man = export(dm, part, kept, tmp_path, {"name": "cifar_resnet8", "kwargs": {}})
    rep = estimate(part, kept)
    params = [s["params"] for s in man["shards"]]
    assert params == rep.params_per_node and params[0] > params[-1]  # invariant 4; node 0 holds the most
    assert json.loads((tmp_path / "manifest.json").read_text())["shares"] == list(shares)
    assert meta_partition(man).fingerprint() == part.fingerprint()
    res = launch(tmp_path, n, ["--warmup", "0", "--iters", "1", "--timeout", "10", "--startup-timeout", "20"],
                 timeout=120)
    assert res["max_rel_err_vs_single_process"] < 1e-4  # invariant 2 across processes
    assert res["bytes_sent_total"] == rep.bytes  # invariant 3
    assert res["params_per_node"] == rep.params_per_node


def test_checkpoint_keeps_shares(tmp_path) -> None:
    model = build_model("cifar_resnet8")
    part = partition(model, (1, 3, 32, 32), 2, (2, 1))
    dm = DiscoModel(model, part, np.random.default_rng(0).random(part.n_links) < 0.5).eval()
    p = save_disco(dm, tmp_path / "m.safetensors", {"name": "cifar_resnet8", "kwargs": {}})
    loaded = load(p)
    assert loaded.partition.shares == (2.0, 1.0)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), dm(x))
