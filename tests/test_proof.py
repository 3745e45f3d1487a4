"""Proof instead of trust (DESIGN invariant 5): an export is checked against the model's own forward,
`disco run` fails on a split that does not match, and nodes rebuild models the meta device cannot build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import StdConv, randomize_bn
from torch import nn

from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model, register_model
from disco.runtime.export import ExportProofError, export, load_node


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c2(torch.relu(self.bn(self.c1(x))))
        return self.fc(y.mean((2, 3)))


def _tiny(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_bn(Tiny())


@pytest.mark.parametrize("masked", [True, False])
def test_export_refuses_a_split_that_differs_from_the_models_forward(tmp_path: Path, masked: bool) -> None:
    model = _tiny()
    part = partition(model, (1, 3, 8, 8), 2)
    kept = np.random.default_rng(0).random(part.n_links) < 0.5
    model.c2.__class__ = StdConv  # the model's own forward now differs from what the partition read
    m = DiscoModel(model, part, kept) if masked else model
    with pytest.raises(ExportProofError, match=r"StdConv at 'c2'"):
        export(m, part, kept, tmp_path, {"name": "tiny"})
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("masked", [True, False])
def test_export_proves_and_stores_the_models_own_output(tmp_path: Path, masked: bool) -> None:
    from safetensors.torch import load_file

    model = _tiny()
    part = partition(model, (1, 3, 8, 8), 2)
    kept = np.random.default_rng(1).random(part.n_links) < 0.5
    m = DiscoModel(model, part, kept) if masked else model
    export(m, part, kept, tmp_path, {"name": "tiny"})
    ref = load_file(str(tmp_path / "reference.safetensors"))
    check = _tiny()
    with torch.no_grad():
        DiscoModel(check, partition(check, (1, 3, 8, 8), 2), kept)
        want = check(ref["input"])
    torch.testing.assert_close(ref["output"], want, rtol=0, atol=1e-6)
    if not masked:  # the plain model got its masks only for the proof
        assert not any(".parametrizations." in k for k in model.state_dict())


class NeedsRealTensors(nn.Module):
    """A constructor that reads tensor values (as torchvision's RegNet does with .tolist())."""

    def __init__(self) -> None:
        super().__init__()
        widths = torch.linspace(4, 12, 2).round().int().tolist()  # fails on the meta device
        self.c1 = nn.Conv2d(3, widths[0], 3, padding=1)
        self.c2 = nn.Conv2d(widths[0], widths[1], 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.c1(x)))


register_model("test_needs_real_tensors")(NeedsRealTensors)


def test_nodes_build_on_cpu_when_the_meta_device_cannot(tmp_path: Path) -> None:
    from disco.runtime.executor import Executor
    from disco.runtime.transport import LocalHub, ThreadTransport

    with pytest.raises(RuntimeError), torch.device("meta"):
        NeedsRealTensors()
    torch.manual_seed(0)
    model = build_model("test_needs_real_tensors")
    part = partition(model, (1, 3, 8, 8), 2)
    kept = np.random.default_rng(0).random(part.n_links) < 0.5
    dm = DiscoModel(model, part, kept)
    export(dm, part, kept, tmp_path, {"name": "test_needs_real_tensors", "kwargs": {}})
    states = [load_node(tmp_path, j, 2) for j in range(2)]
    assert all(p.device.type == "meta" for s in states for p in s.gm.parameters())  # no full weights kept
    hub = LocalHub()
    import threading

    x = torch.randn(1, 3, 8, 8)
    out = {}
    execs = [Executor(s.plan, s.gm, s.weights, ThreadTransport(hub, j, 2, timeout=10)) for j, s in enumerate(states)]
    ts = [threading.Thread(target=lambda j=j: out.__setitem__(j, execs[j].run([x] if j == 0 else None)))
          for j in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    with torch.no_grad():
        torch.testing.assert_close(out[0], dm(x), rtol=0, atol=1e-5)


def _disco(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disco.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.dist
@pytest.mark.slow
def test_export_by_model_name_then_run_and_fail_on_a_wrong_answer(tmp_path: Path) -> None:
    d = tmp_path / "e"
    r = _disco("export", "cifar_resnet8", "--nodes", "2", "--ratio", "0.2", "--input-shape", "1,3,32,32",
               "--out", str(d), "--json")
    assert r.returncode == 0, r.stderr
    man = json.loads((d / "manifest.json").read_text())
    assert abs(man["ratio"] - 0.2) < 0.05 and man["model"]["name"] == "cifar_resnet8"
    fast = ["--warmup", "0", "--iters", "1", "--timeout", "5", "--startup-timeout", "10"]
    r = _disco("run", str(d), "--nodes", "2", "--json", *fast)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["max_rel_err_vs_single_process"] <= 1e-4 and rep["bytes_sent_total"] == rep["bytes_predicted"]
    # fp16 on the wire: an error near 1e-3, above the limit asked for (the reference itself is checksummed)
    r = _disco("run", str(d), "--nodes", "2", "--json", "--codec", "fp16", "--max-rel-err", "1e-6", *fast)
    assert r.returncode == 3 and "--max-rel-err" in r.stderr
    r = _disco("run", str(d), "--nodes", "2", "--json", "--codec", "fp16", "--max-rel-err", "0.1", *fast)
    assert r.returncode == 0, r.stderr
