"""Runtime node plans, run as threads of one process: invariants 2-4 on many shapes of graph (fast)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from reference import rel_err
from torch import nn

from disco.cost import estimate
from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.export import ShardError, export, load_node
from disco.runtime.local import simulate
from disco.runtime.transport import LinkModel, get_codec, parse_bandwidth, parse_latency


class Zoo(nn.Module):
    """Depthwise and grouped convs, a replicated operand of an add, cat, ConvTranspose, flatten of planes."""

    def __init__(self) -> None:
        super().__init__()
        self.c0 = nn.Conv2d(3, 3, 1)
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 16, 3, padding=1, groups=8)
        self.g = nn.Conv2d(16, 12, 1, groups=2)
        self.up = nn.ConvTranspose2d(12, 6, 2, stride=2)
        self.pool = nn.AvgPool2d(2)
        self.c2 = nn.Conv2d(26, 10, 3, stride=2, padding=1, padding_mode="reflect")
        self.ap = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(40, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.c0(x)
        a = torch.relu(self.bn(self.c1(x)))
        b = self.g(self.dw(a))
        u = self.pool(self.up(b))
        y = self.ap(self.c2(torch.cat([a, b, u], 1)))
        return self.fc(torch.flatten(y, 1))


def _randomize(m: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.normal_(generator=g)
                mod.running_var.uniform_(0.5, 2.0, generator=g)
                mod.weight.normal_(generator=g)
                mod.bias.normal_(generator=g)
    return m.eval()


def _setup(name: str, n: int, frac: float = 0.3, seed: int = 0):  # noqa: ANN202
    torch.manual_seed(seed)
    model = _randomize(Zoo() if name == "zoo" else build_model(name), seed)
    x = torch.randn(1, 3, 32, 32)
    part = partition(model, x, n)
    kept = np.random.default_rng(seed + n).random(part.n_links) < frac
    dm = DiscoModel(model, part, kept)
    with torch.no_grad():
        ref = dm(x)
    return model, part, kept, dm, x, ref


@pytest.mark.parametrize("name", ["cifar_resnet8", "cifar_resnet20", "zoo", "rrdbnet_tiny", "mobilenet_v3_small",
                                  "resnet18", "vit_tv_test"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_plan_matches_disco_model_and_cost(name: str, n: int) -> None:
    _, part, kept, _, x, ref = _setup(name, n)
    out, trs = simulate(part, kept, x, timeout=10)
    assert rel_err(out, ref) < 1e-4  # invariant 2
    assert sum(t.payload_bytes for t in trs) == estimate(part, kept).bytes  # invariant 3
    link_bytes = sum(t.link_bytes for t in trs)
    assert np.array_equal(link_bytes, np.where(kept, part.links.values * 4, 0))  # every kept link, exactly once


@pytest.mark.parametrize("kept_kind", ["all", "none"])
def test_plan_dense_and_separated(kept_kind: str) -> None:
    _, part, _, dm, x, _ = _setup("zoo", 3)
    kept = part.all_links() if kept_kind == "all" else part.no_links()
    dm.set_kept(kept)
    with torch.no_grad():
        ref = dm(x)
    out, trs = simulate(part, kept, x, timeout=10)
    assert rel_err(out, ref) < 1e-4
    assert sum(t.payload_bytes for t in trs) == estimate(part, kept).bytes


@pytest.mark.parametrize("codec,tol", [("fp16", 5e-3), ("bf16", 5e-2), ("int8", 5e-2)])
def test_lossy_codecs_report_error_and_bytes(codec: str, tol: float) -> None:
    _, part, kept, _, x, ref = _setup("cifar_resnet8", 2)
    out, trs = simulate(part, kept, x, codec=codec, timeout=10)
    err = rel_err(out, ref)
    assert 0 < err < tol
    c = get_codec(codec)
    assert sum(t.payload_bytes for t in trs) == estimate(part, kept, bytes_per_value=c.bytes_per_value).bytes


def test_int8_codec_roundtrip_per_channel_scale() -> None:
    c = get_codec("int8")
    t = torch.randn(2, 5, 4, 4) * torch.tensor([1e-3, 1, 10, 100, 0.0]).view(1, 5, 1, 1)
    buf = c.encode(t, 1)
    assert buf.numel() == c.nbytes(tuple(t.shape), 1) == t.numel() + 5 * 4
    back = c.decode(buf, tuple(t.shape), 1)
    amax = t.abs().amax(dim=(0, 2, 3), keepdim=True)
    assert ((back - t).abs() <= amax / 127 * 0.51 + 1e-12).all()


def test_parse_link() -> None:
    assert parse_bandwidth("100mbit") == 1e8 and parse_bandwidth("1gbit") == 1e9 and parse_bandwidth(None) is None
    assert parse_latency("2ms") == pytest.approx(0.002) and parse_latency("500us") == pytest.approx(5e-4)
    with pytest.raises(ValueError):
        parse_bandwidth("fast")


def test_pacing_slows_down_by_the_link_model() -> None:
    _, part, kept, _, x, ref = _setup("cifar_resnet8", 2, frac=1.0)
    import time

    t0 = time.perf_counter()
    out, trs = simulate(part, kept, x, link=LinkModel(8e6, 0.001), timeout=10)  # 1 MB/s
    dt = time.perf_counter() - t0
    assert rel_err(out, ref) < 1e-4
    # the two directions overlap; at least the larger direction's bytes must have crossed at 1 MB/s
    assert dt >= max(t.payload_bytes for t in trs) / 1e6


@pytest.mark.parametrize("name", ["cifar_resnet8", "zoo", "vit_tv_test"])
@pytest.mark.parametrize("n", [2, 4])
def test_export_shards_hold_only_own_weights(tmp_path, name: str, n: int) -> None:
    model, part, kept, dm, x, ref = _setup(name, n)
    man = export(dm, part, kept, tmp_path, {"name": name, "kwargs": {}} if name != "zoo" else {"name": "zoo"})
    rep = estimate(part, kept)
    assert [s["params"] for s in man["shards"]] == rep.params_per_node  # invariant 4
    assert json.loads((tmp_path / "manifest.json").read_text())["nodes"] == n
    if name == "zoo":
        return  # not a registered model: a node cannot rebuild it
    for j in range(n):
        st = load_node(tmp_path, j, n)
        assert st.weight_bytes == man["shards"][j]["bytes"]
        assert sum(t.numel() for t in st.weights.values()) <= sum(p.numel() for p in model.parameters()) + 200


def test_shard_refusals(tmp_path) -> None:
    _, part, kept, dm, _, _ = _setup("cifar_resnet8", 2)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    export(dm, part, kept, a, {"name": "cifar_resnet8", "kwargs": {}})
    _, part3, kept3, dm3, _, _ = _setup("cifar_resnet8", 3, seed=1)
    export(dm3, part3, kept3, b, {"name": "cifar_resnet8", "kwargs": {}})
    _, part2, kept2, dm2, _, _ = _setup("cifar_resnet8", 2, seed=5)
    export(dm2, part2, kept2, c, {"name": "cifar_resnet8", "kwargs": {}})
    with pytest.raises(ShardError, match="3 nodes"):
        load_node(b, 0, 2)
    import shutil

    shutil.copy(c / "node1.safetensors", a / "node1.safetensors")
    with pytest.raises(ShardError, match="another model"):
        load_node(a, 1, 2)
    shutil.copy(a / "node0.safetensors", a / "node1.safetensors")
    with pytest.raises(ShardError, match="belongs to rank 0"):
        load_node(a, 1, 2)
    shutil.copy(b / "node1.safetensors", a / "node1.safetensors")
    with pytest.raises(ShardError, match="3 nodes"):
        load_node(a, 1, 2)
    raw = bytearray((a / "node0.safetensors").read_bytes())
    raw[-20:] = bytes(20)
    (a / "node0.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="damaged"):
        load_node(a, 0, 2)
