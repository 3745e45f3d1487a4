"""Pretrained networks (issue 42): foreign weights mapped in order, the ImageNet metrics and the guard, the
layer-wise reconstruction, and the preprocessing carried by the checkpoint and both exports."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import disco
from disco.data.imagenet import IMAGENETTE_CLASSES, Photos
from disco.models import load_weights, map_in_order, preprocess_of
from disco.sparsify.calibrate import activation_scores, bias_sinks, recalibrate_bn, reconstruct
from disco.tasks.imagenet import imagenet_metrics, share_in

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


class Tiny(nn.Module):
    """conv 3x3 -> BN -> ReLU -> 1x1 -> BN -> ReLU -> 1x1 -> pool -> linear: mixing layers the refit can do."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(16)
        self.pw1 = nn.Conv2d(16, 32, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.pw2 = nn.Conv2d(32, 24, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(24)
        self.fc = nn.Linear(24, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn0(self.stem(x)))
        x = torch.relu(self.bn1(self.pw1(x)))
        x = torch.relu(self.bn2(self.pw2(x)))
        return self.fc(x.mean((2, 3)))


def _foreign(state: dict[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    """The same tensors under another naming (as the efficientnet-lite0 package's ``_blocks.N._conv``)."""
    return OrderedDict((f"_m{i}._{k.replace('.', '_')}.{k.rsplit('.', 1)[-1]}", v.clone())
                       for i, (k, v) in enumerate(state.items()))


def test_foreign_naming_maps_in_order(tmp_path: Path) -> None:
    torch.manual_seed(0)
    src, dst = Tiny().eval(), Tiny().eval()
    for m in src.modules():  # non-default statistics so that a swap would show
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2)
    f = tmp_path / "foreign.pth"
    torch.save(_foreign(src.state_dict()), f)
    load_weights(dst, f)
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(src(x), dst(x))


def test_foreign_naming_refused_when_order_does_not_fit(tmp_path: Path) -> None:
    state = _foreign(Tiny().state_dict())
    keys = list(state)
    i, j = keys.index(next(k for k in keys if k.endswith("running_mean"))), None
    j = i + 1  # running_var: same shape, another kind; a swap must not load
    items = list(state.items())
    items[i], items[j] = items[j], items[i]
    f = tmp_path / "swapped.pth"
    torch.save(OrderedDict(items), f)
    with pytest.raises(ValueError, match=r"cannot be mapped in order: tensor \d+ of the file"):
        load_weights(Tiny(), f)
    short = OrderedDict(list(state.items())[:-1])
    torch.save(short, f)
    with pytest.raises(ValueError, match="the file has 19 tensors, the model 20"):
        load_weights(Tiny(), f)


def test_map_in_order_checks_shapes() -> None:
    own = {"a.weight": torch.zeros(2, 3), "a.bias": torch.zeros(2)}
    mapped, why = map_in_order(own, {"x.weight": torch.ones(2, 3), "x.bias": torch.ones(2)})
    assert why == "" and set(mapped) == {"a.weight", "a.bias"} and mapped["a.bias"].sum() == 2
    mapped, why = map_in_order(own, {"x.weight": torch.ones(3, 2), "x.bias": torch.ones(2)})
    assert mapped is None and "[3, 2]" in why


def test_preprocess_of_timm_model() -> None:
    timm = pytest.importorskip("timm")
    m = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    pre = preprocess_of(m, 1000, 224)
    assert pre["mean"] == [0.5] * 3 and pre["std"] == [0.5] * 3 and pre["size"] == [224, 224]
    assert len(pre["labels"]) == 1000 and pre["labels"][0] == "tench"


def test_imagenet_metrics_and_share() -> None:
    labels = torch.tensor([0, 217, 5, 9])
    sets = {"inette": Photos(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), labels, ["inette"] * 4),
            "sample1000": Photos(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), labels, ["s"] * 4)}
    pred = torch.tensor([[0, 1, 2, 3, 4], [1, 217, 2, 3, 4], [482, 5, 1, 2, 3], [9, 0, 1, 2, 3]])
    ref = torch.tensor([[0] * 5, [1] * 5, [3] * 5, [3] * 5])
    m = imagenet_metrics({"inette": pred, "sample1000": pred}, sets, {"inette": ref, "sample1000": ref})
    assert m["top1_inette"] == 50.0 and m["top1_sample1000"] == 50.0
    assert m["top5_sample1000"] == 100.0
    assert m["agree_inette"] == 50.0 and m["agree_sample1000"] == 50.0
    assert m["share_in_train_classes_sample1000"] == 50.0  # predictions 0 and 482 are Imagenette classes
    assert share_in(torch.tensor([[c] for c in IMAGENETTE_CLASSES])) == 100.0


def _cut(nodes: int = 2, ratio: float = 0.2) -> tuple[Tiny, disco.DiscoModel]:
    torch.manual_seed(0)
    dense = Tiny().eval()
    with torch.no_grad():  # informative statistics: recalibrate on random inputs first
        recalibrate_bn(dense, lambda: [torch.randn(16, 3, 8, 8) for _ in range(4)])
    student = Tiny().eval()
    student.load_state_dict(dense.state_dict())
    dm = disco.DiscoModel(student, disco.partition(student, (1, 3, 8, 8), nodes))
    dm.set_kept(disco.select_links(dm, ratio))
    return dense, dm


def test_reconstruction_reduces_each_layers_error() -> None:
    dense, dm = _cut()
    torch.manual_seed(1)
    cal = [torch.randn(32, 3, 8, 8) for _ in range(4)]
    test = torch.randn(64, 3, 8, 8)
    with torch.no_grad():
        before = float((dm(test) - dense(test)).norm() / dense(test).norm())
    kept = dm.kept.copy()
    rep = reconstruct(dm, dense, lambda: cal, ridge=1e-3, progress=False)
    assert {"pw1", "pw2"} <= set(rep) and "stem" not in rep  # the cut 1x1 convolutions; never the 3x3 stem
    for name, (b, a) in rep.items():
        assert a < b, (name, b, a)
    with torch.no_grad():
        after = float((dm(test) - dense(test)).norm() / dense(test).norm())
    assert after < before
    assert np.array_equal(dm.kept, kept)  # the kept set is untouched: the masks still hold
    for ly in dm.partition.layers:
        m = dm.model.get_submodule(ly.name)
        assert torch.equal(m.weight, m.weight * m.parametrizations[ly.param][0].mask)


def test_reconstruction_with_every_link_kept_changes_nothing() -> None:
    dense, dm = _cut(ratio=1.0)
    x = torch.randn(8, 3, 8, 8)
    ref = dm(x)
    assert reconstruct(dm, dense, lambda: [torch.randn(8, 3, 8, 8)], progress=False) == {}
    assert torch.equal(dm(x), ref)


def test_activation_scores_weigh_by_activation() -> None:
    _, dm = _cut()
    s = activation_scores(dm, lambda: [torch.randn(8, 3, 8, 8)])
    assert s.shape == (dm.partition.n_links,) and (s >= 0).all() and s.max() > 0
    assert abs(dm.ratio - 0.2) < 0.05  # the kept set is restored after measuring


def test_recalibrate_bn_resets_statistics() -> None:
    m = Tiny()
    n = recalibrate_bn(m, lambda: [torch.randn(8, 3, 8, 8) * 3 + 1])
    assert n == 3 and not m.training
    assert abs(float(m.bn0.running_mean.mean())) > 0 and m.bn0.momentum == 0.1


class Tiny1k(Tiny):
    def __init__(self) -> None:
        super().__init__(classes=1000)


def test_guard_stops_a_collapse(tmp_path: Path) -> None:
    from recipes.pretrained.finetune import FinetuneConfig, distill, guard_check

    torch.manual_seed(0)
    teacher, student = Tiny1k().eval(), Tiny1k().eval()
    with torch.no_grad():  # a student that calls everything an Imagenette class
        student.fc.bias.fill_(-10)
        student.fc.bias[IMAGENETTE_CLASSES[3]] = 10
    imgs = torch.randint(0, 255, (12, 3, 16, 16), dtype=torch.uint8)
    pool = Photos(imgs, torch.full((12,), -1), ["inette_train"] * 6 + ["coco128"] * 6)
    pre = {"mean": [0.5] * 3, "std": [0.5] * 3, "size": [16, 16]}
    g = guard_check(student, torch.zeros(12, dtype=torch.long), pool, pre, 16)
    assert g["share_guard_other"] == 100.0
    cfg = FinetuneConfig(images=8, batch_size=4, size=16, guard_every=4, max_share_rise=10.0)
    start = {k: v.clone() for k, v in student.state_dict().items()}
    res = distill(student, teacher, "fc", pool, pool, pre, cfg, 0, tmp_path / "state.pt")
    assert res["stopped"] and res["stopped"].startswith("collapse")
    assert res["train_images_seen"] == 4  # stopped at the first check
    assert res["best_images"] == 0  # a collapsed state is never kept, whatever its agreement: the start is
    assert all(torch.equal(v, start[k]) for k, v in student.state_dict().items())
    from recipes.pretrained.finetune import better

    assert better({"agree_guard": 60.0, "share_guard_other": 5.0}, 50.0, 1.0, 10.0)
    assert not better({"agree_guard": 60.0, "share_guard_other": 53.0}, 50.0, 1.0, 10.0)  # more agreement, but
    assert not better({"agree_guard": 40.0, "share_guard_other": 5.0}, 50.0, 1.0, 10.0)  # collapsed / worse


def _tiny_checkpoint(tmp_path: Path) -> Path:
    from disco.loading import save_disco
    from disco.models import build_model

    torch.manual_seed(0)
    model = build_model("cifar_resnet8", num_classes=10).eval()
    dm = disco.DiscoModel(model, disco.partition(model, (1, 3, 32, 32), 2))
    dm.set_kept(disco.select_links(dm, 0.2))
    pre = {"size": [32, 32], "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.2, 0.2], "scale": 255.0,
           "labels": [f"class{i}" for i in range(10)]}
    f = tmp_path / "ck.safetensors"
    save_disco(dm, f, {"name": "cifar_resnet8", "kwargs": {"num_classes": 10}}, task="cifar10",
               info={"preprocess": pre})
    return f


@pytest.mark.parametrize("fmt", ["torch", "onnx"])
def test_export_carries_preprocess(tmp_path: Path, fmt: str) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    from disco.runtime.formats import export_checkpoint

    ck = _tiny_checkpoint(tmp_path)
    man = export_checkpoint(ck, tmp_path / fmt, fmt=fmt)
    on_disk = json.loads((tmp_path / fmt / "manifest.json").read_text())
    for m in (man, on_disk):
        assert m["preprocess"]["mean"] == [0.4, 0.5, 0.6] and m["preprocess"]["labels"][9] == "class9"


@pytest.mark.data
@pytest.mark.skipif(not (DATA / "imagenet_sample1000" / "val.tar").is_file(),
                    reason="needs ../shared/data/imagenet_sample1000 (absent)")
def test_sample1000_labels_are_imagenet_indices() -> None:
    from disco.data.imagenet import load_eval

    s = load_eval(DATA, "sample1000")
    assert len(s) == 1000 and sorted(s.labels.tolist()) == list(range(1000))
    assert s.images.dtype == torch.uint8 and tuple(s.images.shape[1:]) == (3, 224, 224)


def _entry(name: str, stage: str, seed: int, sample: float, nodes: int = 2, ratio: float = 0.2) -> dict:
    return {"name": name, "nodes": nodes, "stage": stage, "seed": seed, "target_ratio": ratio, "ratio": ratio,
            "selection": "activation", "top1_sample1000": sample, "top1_inette": 72.0, "agree_sample1000": 80.0,
            "share_in_train_classes_sample1000": 1.0, "flops_ratio": 0.8, "weights_per_node_ratio": 0.46,
            "bytes": 1000, "dense_bytes": 5000, "model": "m", "train_images_seen": 0}


def test_pretrained_page_states_each_target() -> None:
    from recipes.pages.pretrained import headline_row, page, verdicts

    dense = {**_entry("dense", "dense", 0, 87.3, nodes=1, ratio=1.0), "top5_sample1000": 97.1}
    entries = [dense, *(_entry("n2_r0.2", "reconstructed", s, 50.0) for s in range(3)),
               *(_entry("n2_r0.2", "finetuned", s, 81.0 + s) for s in range(3)),
               _entry("n2_r0.1", "finetuned", 0, 75.0, ratio=0.1), _entry("n2_r0", "finetuned", 0, 60.0, ratio=0.0)]
    v = verdicts(entries)
    assert "n2_r0.2 top1_sample1000 >= 80: 82.00 ± 1.00 (3 seeds, stage finetuned): met" in v
    assert "n2_r0.1 top1_sample1000 >= 70: 75.00 ± 0.00 (1 seed, stage finetuned): met on fewer than 3 seeds" in v
    assert "n2_r0.2_joint top1_sample1000 >= 70: **not measured**" in v
    assert "n2_r0.1 >= separated branches + 5 on the sample: 75.00 against 60.00 (stage finetuned, 1 seed)" in v
    assert "n2_r0.2 >= separated branches + 5 on the sample: 82.00 against 60.00 (stage finetuned, 1 seed)" in v
    assert "| n2_r0.2 | 2 | activation | reconstructed | 0.200 | 3 | 0/0/0 | 50.00 ± 0.00 |" in page(entries, Path("."))
    row = headline_row(entries)
    assert row is not None and row[3] == "87.30" and row[4].startswith("75.00 ± 0.00 (activation, finetuned, 1 seed)")
    missed = [dense, _entry("n2_r0.2", "finetuned", 0, 70.0)]
    assert "**missed** by 10.00" in verdicts(missed)


def test_reconstruction_of_every_layer_absorbs_upstream_error() -> None:
    dense, dm = _cut()
    _, dm_cut = _cut()
    torch.manual_seed(1)
    cal = [torch.randn(32, 3, 8, 8) for _ in range(4)]
    rep_all = reconstruct(dm, dense, lambda: cal, ridge=1e-3, layers="all", progress=False)
    rep_cut = reconstruct(dm_cut, dense, lambda: cal, ridge=1e-3, layers="cut", progress=False)
    assert set(rep_cut) <= set(rep_all)
    test = torch.randn(64, 3, 8, 8)
    with torch.no_grad():
        err = {k: float((m(test) - dense(test)).norm() / dense(test).norm()) for k, m in (("all", dm), ("cut", dm_cut))}
    assert err["all"] <= err["cut"] * 1.05
    with pytest.raises(ValueError, match="layers must be"):
        reconstruct(dm, dense, lambda: cal, layers="some")


def test_reconstruction_folds_the_lost_mean_into_the_next_batch_norm() -> None:
    """pw1 and pw2 have no bias; after the cut their outputs lose the mean the cut (post-ReLU, positive) channels
    carried. The refit with a bias folded into bn1/bn2's running mean fits each layer better than without."""
    torch.manual_seed(1)
    cal = [torch.randn(32, 3, 8, 8) for _ in range(4)]
    dense, dm = _cut()
    _, dm_plain = _cut()
    assert set(bias_sinks(dm.model, ["pw1", "pw2", "fc"], cal[0])) == {"pw1", "pw2"}  # fc has its own bias
    means = {n: dm.model.get_submodule(n).running_mean.clone() for n in ("bn1", "bn2")}
    folded = reconstruct(dm, dense, lambda: cal, ridge=1e-3, fold_bias=True, progress=False)
    plain = reconstruct(dm_plain, dense, lambda: cal, ridge=1e-3, progress=False)
    assert folded["pw1"][1] < plain["pw1"][1]
    assert all(not torch.equal(dm.model.get_submodule(n).running_mean, v) for n, v in means.items())
    test = torch.randn(64, 3, 8, 8)
    with torch.no_grad():
        err = {k: float((m(test) - dense(test)).norm() / dense(test).norm()) for k, m in (("fold", dm),
                                                                                            ("plain", dm_plain))}
    assert err["fold"] < err["plain"]


def test_post_bn_scores_weigh_each_layer_by_its_batch_norms_scale() -> None:
    """A link into pw1, whose batch norm multiplies its output by 100, scores 100x more with ``post_bn``; a
    link into fc (no batch norm after it) scores the same."""
    _, dm = _cut()
    bn1 = dm.model.get_submodule("bn1")
    with torch.no_grad():
        bn1.running_var.fill_(1e-4 - bn1.eps)
        bn1.weight.fill_(1.0)
    cal = [torch.randn(8, 3, 8, 8)]
    plain, scaled = activation_scores(dm, lambda: cal), activation_scores(dm, lambda: cal, post_bn=True)
    by = {ly.name: ly.col_link[ly.col_link >= 0] for ly in dm.partition.layers}
    assert np.allclose(scaled[by["pw1"]], 100 * plain[by["pw1"]])
    assert np.allclose(scaled[by["fc"]], plain[by["fc"]])
