"""Every bad value a newcomer can type gets one line on stderr and exit code 2 (no traceback).

The cases are the ones of issue 19 ("A newcomer's first hour"); each either works or is refused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from disco import validate as v
from disco.cli import main
from disco.errors import RefusedError

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "src" / "disco" / "assets" / "cifar_resnet20_n2_r0.2.safetensors"
SHARED = ROOT.parent / "shared" / "data"


def _refused(capsys, argv: list[str], *words: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# ---- the validator itself ---------------------------------------------------------------------

@pytest.mark.parametrize("s,bps", [("100mbit", 1e8), ("1gbit", 1e9), ("500kbit", 5e5), ("100Mbit/s", 1e8),
                                   ("10mbps", 1e7), ("2.5gbit", 2.5e9), (None, None), ("none", None)])
def test_bandwidth_units(s, bps):
    assert v.parse_bandwidth(s) == bps


@pytest.mark.parametrize("s", ["100mb", "100MB/s", "2", "0", "0mbit", "-5mbit", "fast", ""])
def test_bandwidth_refused(s):
    with pytest.raises(RefusedError):
        v.parse_bandwidth(s)


@pytest.mark.parametrize("s,sec", [("2ms", 2e-3), ("500us", 5e-4), ("0.01s", 0.01), ("0ms", 0.0), (None, 0.0)])
def test_latency_units(s, sec):
    assert v.parse_latency(s) == pytest.approx(sec)


@pytest.mark.parametrize("s", ["2", "0", "-2ms", "2 min", ""])
def test_latency_refused(s):
    with pytest.raises(RefusedError):
        v.parse_latency(s)


def test_numbers_and_codecs():
    assert v.check_nodes(2) == 2 and v.check_ratio(0) == 0 and v.check_ratio(1) == 1
    for bad in (lambda: v.check_nodes(1), lambda: v.check_nodes(0), lambda: v.check_ratio(1.01),
                lambda: v.check_ratio(-0.1), lambda: v.check_positive(0, "--epochs"),
                lambda: v.check_codec("fp8"), lambda: v.parse_shape("1,3,0,32"), lambda: v.parse_shape("a,b")):
        with pytest.raises(RefusedError):
            bad()
    assert [v.check_codec(c) for c in ("fp32", "fp16", "bf16", "int8")] == ["fp32", "fp16", "bf16", "int8"]


@pytest.mark.parametrize("name,shape", [("cifar_resnet20", (1, 3, 32, 32)), ("vit_cifar", (1, 3, 32, 32)),
                                        ("rrdbnet_tiny", (1, 3, 24, 24)), ("deeplabv3plus_tiny", (1, 3, 180, 240)),
                                        ("ssd_tiny_split", (1, 3, 128, 128)), ("resnet18", (1, 3, 224, 224))])
def test_default_input_shape(name, shape):
    assert v.default_input_shape(name) == shape


# ---- the commands -----------------------------------------------------------------------------

@pytest.mark.parametrize("argv,words", [
    (["cost", "cifar_resnet8", "--nodes", "0"], ["--nodes", ">= 2"]),
    (["cost", "cifar_resnet8", "--nodes", "1"], ["--nodes", "not a split"]),
    (["cost", "cifar_resnet8", "--nodes", "100"], ["100", "widest layer", "64"]),
    (["cost", "cifar_resnet8", "--input-shape", "1,1,224,224"], ["3 input channels"]),
    (["cost", "cifar_resnet8", "--input-shape", "1,3,224"], ["4-d input"]),
    (["cost", "cifar_resnet8", "--input-shape", "1,3,x,32"], ["comma-separated"]),
    (["cost", "vit_tiny_test", "--input-shape", "1,3,64,64"], ["cannot take input shape 1,3,64,64", "1,3,32,32"]),
    (["cost", "cifar_resnet8", "--ratio", "1.5"], ["--ratio", "[0, 1]"]),
    (["cost", "no_such_model_xyz"], ["unknown model"]),
    (["train", "--data", "x", "--epochs", "0", "--out", "o.safetensors"], ["--epochs", "> 0", "--weights"]),
    (["train", "--data", "x", "--limit", "0", "--out", "o.safetensors"], ["--limit", "> 0"]),
    (["train", "--data", "x", "--task", "nope", "--out", "o.safetensors"], ["unknown task"]),
    (["sparsify", "d.safetensors", "--data", "x", "--ratio", "0.2", "--epochs", "-1", "--out", "o"], ["--epochs"]),
    (["sparsify", "d.safetensors", "--data", "x", "--ratio", "2", "--out", "o"], ["--ratio"]),
    (["demo", "--bandwidth", "100mb"], ["100mb", "100mbit"]),
    (["demo", "--bandwidth", "0"], ["bandwidth"]),
    (["export", str(DEMO), "--out", "x", "--codec", "fp8"], ["fp8", "fp16"]),
    (["eval", "missing.safetensors", "--data", "x"], ["missing.safetensors"]),
])
def test_refused_in_one_line(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    _refused(capsys, argv, *words)


def test_cost_uses_the_models_own_shape(capsys):
    import json

    assert main(["cost", "vit_tiny_test", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [1, 3, 32, 32]
    assert main(["cost", "cifar_resnet8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [1, 3, 32, 32]


def test_nodes_beyond_the_narrowest_layer_warn(caplog):
    assert main(["cost", "cifar_resnet8", "--nodes", "12"]) == 0  # fc has 10 outputs
    assert "narrowest layer fc" in caplog.text


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp") / "e"
    assert main(["export", str(DEMO), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("extra,words", [
    (["--codec", "fp8"], ["fp8"]),
    (["--bandwidth", "100mb"], ["100mbit"]),
    (["--latency", "2"], ["unit"]),
    (["--limit", "0"], ["--limit"]),
    (["--input", "README.md"], ["README.md", "not a tensor file"]),
    (["--input", "nowhere.pt"], ["nowhere.pt"]),
    (["--data", "nowhere"], ["nowhere", "does not exist"]),
])
def test_run_refused_before_nodes_start(capsys, export_dir, monkeypatch, extra, words):
    monkeypatch.chdir(ROOT)
    _refused(capsys, ["run", str(export_dir), "--nodes", "2", *extra], *words)


def test_run_nodes_mismatch(capsys, export_dir):
    _refused(capsys, ["run", str(export_dir), "--nodes", "3"], "exported for 2 nodes")


def test_damaged_shard_one_line_exit_2(capsys, export_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(export_dir, bad)
    p = bad / "node1.safetensors"
    b = bytearray(p.read_bytes())
    b[-100] ^= 0xFF
    p.write_bytes(bytes(b))
    line = _refused(capsys, ["run", str(bad), "--nodes", "2", "--iters", "1", "--warmup", "0"], "damaged")
    assert line.count("is damaged") == 1  # reported by two ranks, printed once


def test_launch_checks_codec_before_start(export_dir):
    from disco.errors import RefusedError
    from disco.runtime.launch import launch

    with pytest.raises(RefusedError, match="fp8"):
        launch(export_dir, 2, ["--codec", "fp8"])


def test_run_text_summary_names_latency(capsys, export_dir):
    assert main(["run", str(export_dir), "--nodes", "2", "--latency", "1ms", "--iters", "2", "--warmup", "0"]) == 0
    assert "1 ms latency" in capsys.readouterr().out


def test_out_parent_created_and_help_shows_defaults(capsys, tmp_path):
    from disco.validate import prepare_output

    p = prepare_output(tmp_path / "runs" / "deeper" / "x.safetensors")
    assert p.parent.is_dir()
    with pytest.raises(RefusedError):
        prepare_output(tmp_path)
    for cmd in ("train", "sparsify", "cost", "eval", "demo", "export", "run"):
        assert main([cmd, "--help"]) == 0
    out = capsys.readouterr().out
    assert "default: 30" in out and "default: 100mbit" in out and "default: fp32" in out and "default: 20" in out


def test_sr_data_pointing_at_one_set(capsys, tmp_path):
    import numpy as np
    from PIL import Image

    s5 = tmp_path / "set5" / "HR"
    s5.mkdir(parents=True)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(s5 / "a.png")
    from disco.tasks import get_task

    with pytest.raises(RefusedError, match="one evaluation set"):
        get_task("sr_x4").loaders(str(tmp_path / "set5"), 2)


def test_broken_pipe_ends_quietly():
    """``disco cost ... --json | head``: here the reader is gone before the first write."""
    import os

    r, w = os.pipe()
    os.close(r)
    code = "import sys; from disco.cli import main; sys.exit(main(['cost', 'cifar_resnet8', '--json']))"
    try:
        p = subprocess.run([sys.executable, "-c", code], stdout=w, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory):
    import pickle

    import numpy as np

    root = tmp_path_factory.mktemp("cifar") / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = rng.integers(0, 10, 8)
        data = rng.integers(0, 255, (8, 3 * 32 * 32), dtype=np.uint8)
        with open(root / name, "wb") as f:
            pickle.dump({"data": data, "labels": labels.tolist()}, f)
    return root.parent


def test_train_creates_runs_and_announces_the_skip(tiny_cifar, tmp_path, monkeypatch, caplog):
    """``--out runs/x`` works without runs/; started again, train says it does not train again."""
    import logging

    monkeypatch.chdir(tmp_path)
    argv = ["train", "--data", str(tiny_cifar), "--model", "cifar_resnet8", "--epochs", "1", "--batch-size", "8",
            "--out", "runs/dense.safetensors"]
    assert main(argv) == 0
    assert (tmp_path / "runs" / "dense.safetensors").is_file()
    caplog.clear()
    assert main(argv) == 0
    notes = [r for r in caplog.records if r.name == "disco.notice"]
    assert notes and "not training again" in notes[0].getMessage()
    assert logging.getLogger("disco.notice").getEffectiveLevel() <= logging.INFO  # shown without -v


def test_training_bar_shows_a_live_loss_and_lr(monkeypatch):
    """The bar's loss and lr change within an epoch (they were set once per 20 steps before)."""
    import torch

    import disco.train as tr

    seen: list[dict] = []

    class Bar:
        def __init__(self, it, **kw):
            self.it = it

        def __iter__(self):
            return iter(self.it)

        def set_postfix(self, **kw):
            seen.append(kw)

    monkeypatch.setattr(tr, "tqdm", Bar)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(6)]
    tr.fit(model, data, torch.nn.functional.cross_entropy, epochs=1, lr=0.1, warmup_epochs=0.5)
    assert len(seen) == 6
    assert len({s["loss"] for s in seen}) > 1 and len({s["lr"] for s in seen}) > 1


def test_sparsify_refuses_more_nodes_than_channels(capsys, tmp_path):
    dense = ROOT / "src" / "disco" / "assets" / "cifar_resnet20_dense.safetensors"
    _refused(capsys, ["sparsify", str(dense), "--data", str(tmp_path), "--nodes", "100", "--ratio", "0.2",
                      "--out", str(tmp_path / "x.safetensors")], "--nodes 100", "widest layer")
