"""Detection: split SSD models (invariants 1-4), the L2 norm channel reduction, post-processing, COCO data and mAP."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import randomize_bn, reference_forward, rel_err
from torch import nn

from disco.cost import estimate
from disco.graph import partition
from disco.graph.capture import capture
from disco.masks import DiscoModel
from disco.models import build_model
from disco.models.ssd import L2Norm, SSDPost, spec_of, to_torchvision_state_dict
from disco.runtime.export import export
from disco.runtime.local import simulate
from disco.tasks import get_task
from disco.tasks.det import coco_map

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# ---- the L2 norm channel reduction (a general rule) --------------------------------------------------

class _Norms(nn.Module):
    """conv -> F.normalize over channels -> conv -> L2Norm module with a per-channel scale -> conv."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.c3 = nn.Conv2d(3, 10, 3, padding=1), nn.Conv2d(10, 7, 1), nn.Conv2d(7, 5, 1)
        self.l2 = L2Norm(7, scale=3.0)
        with torch.no_grad():
            self.l2.weight.uniform_(1, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.normalize(self.c1(x), dim=1)
        return self.c3(self.l2(self.c2(y)))


class _Tokens(nn.Module):
    """A LayerNorm over split token channels (the other reduction, through the same executor path)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.ln, self.b = nn.Linear(6, 9), nn.LayerNorm(9), nn.Linear(9, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.ln(self.a(x)))


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("which", ["norms", "tokens"])
def test_channel_reductions_exact_and_counted(which: str, n: int) -> None:
    torch.manual_seed(n)
    model = (_Norms() if which == "norms" else _Tokens()).eval()
    x = torch.randn((2, 3, 8, 8) if which == "norms" else (2, 5, 6))
    part = partition(model, x, n)
    kept = np.random.default_rng(n).random(part.n_links) < 0.4
    dm = DiscoModel(model, part, kept)
    with torch.no_grad():
        ref = dm(x)
    out, trs = simulate(part, kept, x, timeout=10)
    assert rel_err(out, ref) < 1e-4
    rep = estimate(part, kept)
    assert sum(t.payload_bytes for t in trs) == rep.bytes
    assert sum(t.stats_bytes for t in trs) == rep.stats_bytes > 0
    if which == "norms":  # one statistic (sum of squares) per position and reduction: 2 reductions
        assert rep.stats_bytes == 4 * 2 * 8 * 8 * n * (n - 1) * 2


def test_normalize_over_other_dim_is_channel_local() -> None:
    """F.normalize over a dim other than the channels (a head's features, issue 43) is channel-local: exact."""
    class Bad(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = nn.Conv2d(3, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.normalize(self.c(x), dim=2)

    torch.manual_seed(0)
    model, x = Bad().eval(), torch.randn(1, 3, 4, 4)
    out, trs = simulate(partition(model, x, 2), None, x, timeout=10)
    with torch.no_grad():
        assert rel_err(out, model(x)) < 1e-5
    assert sum(t.stats_bytes for t in trs) == 0  # nothing exchanged: no statistic over the channels


# ---- split SSD models: invariants 1-4 ------------------------------------------------------------------

_SHAPES = {"ssd_tiny_split": (1, 3, 64, 64), "ssd_small_split": (1, 3, 64, 64), "ssdlite320_split": (1, 3, 64, 64)}


def _setup(name: str, n: int, frac: float = 0.3):  # noqa: ANN202
    torch.manual_seed(0)
    model = randomize_bn(build_model(name, num_classes=5))
    x = torch.randn(_SHAPES[name])
    part = partition(model, x, n)
    kept = np.random.default_rng(n).random(part.n_links) < frac
    return model, part, kept, x


@pytest.mark.parametrize("name", list(_SHAPES))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_split_ssd_invariants(tmp_path: Path, name: str, n: int) -> None:
    model, part, kept, x = _setup(name, n)
    plain = copy.deepcopy(model)
    with torch.no_grad():
        orig = plain(x)
    dm = DiscoModel(model, part)  # every link kept: the original model (invariant 1)
    with torch.no_grad():
        assert rel_err(dm(x), orig) < 1e-5
        dm.set_kept(kept)
        ref = dm(x)
    assert len(ref) == 2 * len(plain.spec.aspect_ratios)  # class and box outputs per level
    # the weight masks compute the activation-masking reference
    ref_gm = capture(plain, x)
    assert rel_err(ref, reference_forward(part, ref_gm, kept, x)) < 1e-5
    out, trs = simulate(part, kept, x, timeout=20)
    assert rel_err(out, ref) < 1e-4  # invariant 2
    rep = estimate(part, kept)
    assert sum(t.payload_bytes for t in trs) == rep.bytes  # invariant 3
    man = export(dm, part, kept, tmp_path, {"name": name, "kwargs": {"num_classes": 5}})
    assert [s["params"] for s in man["shards"]] == rep.params_per_node  # invariant 4
    assert sum(rep.params_per_node) < n * rep.params_dense


@pytest.mark.slow  # VGG16 at 300x300: a few GFLOPs per run
def test_vgg16_ssd_splits_with_the_l2norm_reduction() -> None:
    torch.manual_seed(0)
    model = build_model("ssd300_vgg16_split", num_classes=3).eval()
    x = torch.randn(1, 3, 300, 300)
    part = partition(model, x, 2)
    assert "L2NormRule" in {type(r).__name__ for r in part.rules.values()}
    kept = np.random.default_rng(0).random(part.n_links) < 0.2
    dm = DiscoModel(model, part, kept)
    with torch.no_grad():
        ref = dm(x)
    out, trs = simulate(part, kept, x, timeout=60)
    assert rel_err(out, ref) < 1e-4
    rep = estimate(part, kept)
    assert sum(t.payload_bytes for t in trs) == rep.bytes
    assert sum(t.stats_bytes for t in trs) == rep.stats_bytes == 4 * 38 * 38 * 2


def test_distributed_detections_match_single_process() -> None:
    torch.manual_seed(0)
    model = randomize_bn(build_model("ssd_tiny_split", num_classes=5))
    x = torch.randn(2, 3, 64, 64)
    part = partition(model, x, 3)
    kept = np.random.default_rng(3).random(part.n_links) < 0.3
    dm = DiscoModel(model, part, kept)
    post = SSDPost(spec_of(dm))
    post.score_thresh = 0.2  # random weights: keep the detections clear of the threshold
    with torch.no_grad():
        single = post.detect(dm(x), (64, 64))
    dist_out, _ = simulate(part, kept, x, timeout=20)
    dist = post.detect(dist_out, (64, 64))
    assert len(single) == len(dist) == 2 and sum(len(d["labels"]) for d in single) > 0
    for a, b in zip(single, dist, strict=True):
        assert torch.equal(a["labels"], b["labels"])
        assert torch.allclose(a["boxes"], b["boxes"], atol=1e-3) and torch.allclose(a["scores"], b["scores"], atol=1e-5)


# ---- torchvision compatibility ---------------------------------------------------------------------------

def test_torchvision_ssdlite_weights_and_detections() -> None:
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    torch.manual_seed(0)
    tv = randomize_bn(ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4))
    ours = build_model("ssdlite320_split", num_classes=4)
    ours.load_state_dict(tv.state_dict(), strict=True)  # same keys
    ours.eval()
    img = torch.rand(3, 320, 320)
    with torch.no_grad():
        ref = tv([img])[0]
        x = tv.transform([img])[0].tensors
        post = SSDPost(spec_of(ours))
        mine = post.detect(ours(x), (320, 320))[0]
    assert torch.equal(ref["labels"], mine["labels"])
    assert torch.allclose(ref["boxes"], mine["boxes"], atol=1e-3)


def test_torchvision_vgg16_ssd_state_dict_loads() -> None:
    from torchvision.models.detection import ssd300_vgg16

    tv = ssd300_vgg16(weights=None, weights_backbone=None, num_classes=3)
    with torch.no_grad():
        tv.backbone.scale_weight.uniform_(1, 2)
    ours = build_model("ssd300_vgg16_split", num_classes=3)
    ours.load_state_dict(tv.state_dict(), strict=True)  # backbone.scale_weight -> backbone.l2norm.weight
    assert torch.equal(ours.backbone.l2norm.weight, tv.backbone.scale_weight)
    back = to_torchvision_state_dict(ours.state_dict())
    assert set(back) == set(tv.state_dict())


# ---- task: loss, distillation, metric ----------------------------------------------------------------------

def test_loss_distill_and_training_step() -> None:
    task = get_task("det_generated")
    torch.manual_seed(0)
    model = build_model("ssd_tiny_split", **task.model_kwargs).train()
    x = torch.randn(2, 3, 128, 128)
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 60.0, 70.0]]), "labels": torch.tensor([3])},
               {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}]
    out = model(x)
    loss = task.loss(out, targets)
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    assert model.head.classification_head.module_list[0][-1].weight.grad is not None
    assert task.distill(out, tuple(o.detach() for o in out)).item() == pytest.approx(0.0, abs=1e-6)
    assert task.distill(out, tuple(o.detach() + 1 for o in out)).item() > 0


def _target(iid: int, boxes: list, labels: list, crowd: list | None = None) -> dict:
    gt = torch.tensor(boxes, dtype=torch.float32)  # x, y, w, h
    return {"image_id": torch.tensor(iid), "orig_size": torch.tensor([100, 100]), "gt_boxes": gt,
            "gt_labels": torch.tensor(labels), "gt_crowd": torch.tensor(crowd or [0] * len(labels)),
            "gt_area": gt[:, 2] * gt[:, 3]}


def test_coco_map_perfect_half_and_empty() -> None:
    ts = [_target(1, [[10, 10, 30, 40]], [1]), _target(2, [[50, 50, 20, 20], [5, 5, 10, 10]], [2, 1])]

    def det(b: list, lab: list) -> dict:
        xyxy = torch.tensor([[v[0], v[1], v[0] + v[2], v[1] + v[3]] for v in b], dtype=torch.float32)
        return {"boxes": xyxy, "scores": torch.ones(len(lab)), "labels": torch.tensor(lab)}

    perfect = coco_map(ts, [det([[10, 10, 30, 40]], [1]), det([[50, 50, 20, 20], [5, 5, 10, 10]], [2, 1])])
    assert perfect["map"] == pytest.approx(100.0) and perfect["map50"] == pytest.approx(100.0)
    shifted = coco_map(ts, [det([[14, 10, 30, 40]], [1]), det([[50, 50, 20, 20], [5, 5, 10, 10]], [1, 2])])
    assert 0 < shifted["map50"] < 100 and shifted["map"] < shifted["map50"]
    assert coco_map(ts, [det([], []), det([], [])]) == {"map": 0.0, "map50": 0.0}


# ---- data ------------------------------------------------------------------------------------------------

@pytest.fixture
def coco128() -> Path:
    d = SHARED / "coco128"
    if not (d / "annotations" / "instances_train2017.json").is_file():
        pytest.skip(f"shared coco128 not found at {d} (needs ../shared/data/coco128)")
    return d


@pytest.mark.data
def test_coco128_loader_and_eval(coco128: Path) -> None:
    task = get_task("det_coco128")
    train, test = task.loaders(str(coco128), 4, limit=6)
    x, ts = next(iter(test))
    assert x.shape == (4, 3, 320, 320) and len(ts) == 4
    for t in ts:
        assert (t["boxes"] >= 0).all() and (t["boxes"] <= 320).all()
        assert t["labels"].min() >= 1 and t["labels"].max() <= 80
        assert len(t["gt_boxes"]) >= len(t["boxes"])  # crowd boxes stay in the ground truth only
    xb, tb = next(iter(train))
    assert xb.shape == (4, 3, 320, 320)
    model = build_model("ssd_tiny_split", **task.model_kwargs)
    res = task.evaluate(model, [(x[:2], ts[:2])])
    assert set(res) >= {"map", "map50", "post_ms", "n"} and res["n"] == 2


@pytest.mark.data
def test_generated_set_is_deterministic_coco(tmp_path: Path) -> None:
    for d in ("cifar10/test.tar", "imagenette224/val.tar"):
        if not (SHARED / d).is_file():
            pytest.skip(f"needs ../shared/data/{d}")
    from disco.data.det import CocoDet, make_generated

    a = make_generated(SHARED, tmp_path / "a", n_train=3, n_test=4, size=64, min_side=12, max_side=30)
    b = make_generated(SHARED, tmp_path / "b", n_train=3, n_test=4, size=64, min_side=12, max_side=30)
    ja = json.loads((a / "annotations" / "instances_test.json").read_text())
    assert ja == json.loads((b / "annotations" / "instances_test.json").read_text())
    assert (a / "test" / "000000.jpg").read_bytes() == (b / "test" / "000000.jpg").read_bytes()
    assert len(ja["images"]) == 4 and len(ja["categories"]) == 10 and len(ja["annotations"]) >= 4
    ds = CocoDet(a, "test", 64)
    t = ds.target(0)
    assert ds.image(0).shape == (3, 64, 64) and len(t["boxes"]) >= 1 and t["labels"].min() >= 1


@pytest.mark.slow
def test_cost_cli_on_vgg16_ssd(capsys: pytest.CaptureFixture) -> None:
    from disco.cli import main

    assert main(["cost", "ssd300_vgg16_split", "--nodes", "2", "--input-shape", "1,3,300,300", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["model"] == "ssd300_vgg16_split" and rep["dense_bytes"] > 0 and rep["stats_bytes"] == 4 * 38 * 38 * 2


def test_loader_batches_flip_and_drop_a_last_batch_of_one() -> None:
    from disco.data.det import DetLoader

    class Fake:
        size = 32

        def __len__(self) -> int:
            return 5

        def image(self, k: int) -> torch.Tensor:
            return torch.full((3, 32, 32), k, dtype=torch.uint8)

        def target(self, k: int) -> dict:
            return {"boxes": torch.tensor([[2.0, 4.0, 10.0, 20.0]]), "labels": torch.tensor([1])}

    test = DetLoader(Fake(), 2)
    assert len(test) == 3 and [len(t) for _, t in test] == [2, 2, 1]
    train = DetLoader(Fake(), 2, train=True, seed=1)
    batches = list(train)
    assert len(train) == len(batches) == 2 and all(x.shape == (2, 3, 32, 32) for x, _ in batches)
    boxes = torch.cat([t["boxes"] for _, ts in batches for t in ts])
    assert {tuple(b) for b in boxes.tolist()} <= {(2.0, 4.0, 10.0, 20.0), (22.0, 4.0, 30.0, 20.0)}


@pytest.mark.dist
def test_disco_run_checks_the_per_level_outputs_against_the_export(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """`disco run` without --input compares every head output with the single-process model's (stored by export)."""
    from safetensors.torch import load_file

    from disco.cli import main
    from disco.runtime.export import compare_reference

    model, part, kept, x = _setup("ssd_tiny_split", 2)
    plain = copy.deepcopy(model)
    dm = DiscoModel(model, part, kept)
    export(dm, part, kept, tmp_path, {"name": "ssd_tiny_split", "kwargs": {"num_classes": 5}})
    ref = load_file(str(tmp_path / "reference.safetensors"))
    assert sorted(ref) == ["input"] + [f"output.{i}" for i in range(10)]
    x = ref.pop("input")
    # the stored outputs are the DISCO function, computed independently (activation masking, unmasked weights)
    assert compare_reference(reference_forward(part, capture(plain, x), kept, x), ref) < 1e-5
    capsys.readouterr()
    assert main(["run", str(tmp_path), "--nodes", "2", "--iters", "2", "--warmup", "0", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["max_rel_err_vs_single_process"] is not None and r["max_rel_err_vs_single_process"] < 1e-4
    assert r["bytes_sent_total"] == r["bytes_predicted"]
