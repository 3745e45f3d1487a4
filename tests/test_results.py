"""The committed checkpoints reproduce the numbers the result tables (docs/) are generated from."""

import json
from pathlib import Path

import pytest

from disco.cli import main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "cifar10_resnet.json"
CLASSIFICATION = [RESULTS, ROOT / "results" / "cifar10_vit.json", ROOT / "results" / "imagenette_resnet.json"]


def _committed():
    return [e for f in CLASSIFICATION if f.is_file() for e in json.loads(f.read_text()) if e.get("checkpoint")]


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("entry", _committed(), ids=lambda e: f"{e['model']}-{e['name']}")
def test_committed_checkpoint_reproduces_top1(entry, cifar_dir, capsys):
    ckpt = ROOT / entry["checkpoint"]
    assert ckpt.is_file(), f"{ckpt} is named in results/ but missing"
    assert main(["eval", str(ckpt), "--data", str(cifar_dir), "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(got["top1"] - entry["top1"]) <= 0.1
    if entry["nodes"] > 1:
        assert abs(got["ratio"] - entry["ratio"]) < 1e-9


@pytest.mark.parametrize("results", CLASSIFICATION, ids=lambda p: p.stem)
def test_results_entries_have_the_required_fields(results):
    if not results.is_file():
        pytest.skip(f"results/{results.name} not produced yet (python recipes/cifar10/run.py)")
    for e in json.loads(results.read_text()):
        for k in ("nodes", "ratio", "budget", "selection", "top1", "bytes", "flops_total", "params_per_node",
                  "checkpoint"):
            assert k in e, f"{e.get('name')}: missing {k}"
        if e["nodes"] > 1:
            assert abs(e["ratio"] - e["target_ratio"]) <= 0.01


@pytest.mark.parametrize("name,metrics", [("seg_deeplabv3plus", ("miou", "pixel_acc", "per_class_iou")),
                                          ("det_ssd", ("map", "map50", "post_ms", "dataset"))])
def test_task_results_have_the_required_fields(name, metrics):
    """Segmentation and detection results: the CNN fields with the task's metrics, every kept ratio on target."""
    f = ROOT / "results" / f"{name}.json"
    if not f.is_file():
        pytest.skip(f"results/{f.name} not produced yet (see recipes/)")
    entries = json.loads(f.read_text())
    assert sum(e["nodes"] == 1 for e in entries) >= 1, "no dense entry"
    for e in entries:
        for k in ("name", "nodes", "ratio", "budget", "selection", "flops_total", "params_per_node", "epochs",
                  *metrics):
            assert k in e, f"{e.get('name')}: missing {k}"
        if e["nodes"] > 1:
            assert abs(e["ratio"] - e["target_ratio"]) <= 0.01
