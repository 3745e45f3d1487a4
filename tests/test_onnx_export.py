"""``disco export --format onnx``: per rank its ONNX segments and schedule.json, proved in onnxruntime
(a torch-free simulation of the N ranks) against the model's own forward; link bytes = the cost model's."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from disco.cost import estimate
from disco.errors import RefusedError
from disco.graph import partition
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.onnx_export import export_onnx


def _export(tmp: Path, name: str, n: int) -> tuple[Path, dict, int]:
    torch.manual_seed(0)
    model = build_model(name).eval()
    part = partition(model, (1, 3, 32, 32), n)
    kept = np.random.default_rng(1).random(part.n_links) < 0.3
    man = export_onnx(DiscoModel(model, part, kept), part, kept, tmp / "onnx", {"name": name, "kwargs": {}})
    return tmp / "onnx", man, estimate(part, kept).bytes


@pytest.mark.parametrize("name,n", [("cifar_resnet8", 2), ("cifar_resnet8", 3), ("vit_tv_test", 2)])
def test_onnx_export_is_proved_and_sends_the_predicted_bytes(tmp_path: Path, name: str, n: int) -> None:
    d, man, predicted = _export(tmp_path, name, n)
    assert man["max_rel_err_onnx"] <= 1e-4
    assert sorted(p.name for p in d.iterdir()) == ["manifest.json"] + [f"rank{j}" for j in range(n)]
    for rel, sha in man["files"].items():
        assert hashlib.sha256((d / rel).read_bytes()).hexdigest() == sha
    sends = []
    for j in range(n):
        sch = json.loads((d / f"rank{j}" / "schedule.json").read_text())
        assert sch["rank"] == j and sch["nodes"] == n
        graphs = {s["graph"] for s in sch["steps"] if s["op"] == "run"}
        assert graphs and all((d / f"rank{j}" / g).is_file() for g in graphs)
        sends += [s for s in sch["steps"] if s["op"] == "send"]
    assert sum(int(np.prod(s["shape"])) for s in sends if s["kind"] == "links") * 4 == predicted
    assert len(sends) == man["messages_per_inference"]


def test_the_simulation_runs_without_torch(tmp_path: Path) -> None:
    """Each rank folder alone, copied elsewhere, and no torch importable: the leader's output is the reference."""
    d, _, _ = _export(tmp_path, "cifar_resnet8", 2)
    code = (
        "import sys, json; sys.modules['torch'] = None\n"
        "import numpy as np\n"
        "from disco.edge.simulate import simulate\n"
        f"d = {str(d)!r}\n"
        "ref = np.load(d + '/rank0/reference.npz')\n"
        "man = json.load(open(d + '/manifest.json'))\n"
        "out, c = simulate(d, {man['input']: ref['input']})\n"
        "(got,) = out.values()\n"
        "err = float(np.abs(got - ref['output']).max() / np.abs(ref['output']).max())\n"
        "assert err < 1e-4, err\n"
        "print('ok', err, c['messages'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.c1(x)))


def test_export_refuses_a_split_that_differs_from_the_models_forward(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Tiny().eval()
    part = partition(model, (1, 3, 8, 8), 2)
    model.forward = lambda x: model.c2(torch.tanh(model.c1(x)))  # the forward now differs from the graph
    with pytest.raises(RefusedError, match="ONNX split differs"):
        export_onnx(model, part, None, tmp_path / "onnx", {"name": "x", "kwargs": {}})
    assert not (tmp_path / "onnx").exists()


def test_export_refuses_a_model_whose_output_is_constant(tmp_path: Path) -> None:
    """A zero last layer makes every split pass an output comparison: the ONNX export refuses (its proof
    compares outputs only) instead of reporting 0/0 as a pass."""
    torch.manual_seed(0)
    model = _Tiny().eval()
    nn.init.zeros_(model.c2.weight)
    if model.c2.bias is not None:
        nn.init.zeros_(model.c2.bias)
    part = partition(model, (1, 3, 8, 8), 2)
    with pytest.raises(RefusedError, match="does not depend on its input"):
        export_onnx(model, part, None, tmp_path / "onnx", {"name": "x", "kwargs": {}})
    assert not (tmp_path / "onnx").exists()


def test_cli_export_format_onnx(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    from disco.cli import main

    rc = main(["export", "cifar_resnet8", "--nodes", "2", "--ratio", "0.2", "--format", "onnx",
               "--out", str(tmp_path / "o"), "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["format"] == "onnx" and out["max_rel_err_onnx"] <= 1e-4
    assert (tmp_path / "o" / "rank1" / "schedule.json").is_file()
