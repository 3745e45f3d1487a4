"""Semantic segmentation: DeepLabV3+ through the general op rules (invariants 1-4), the CamVid and
Cityscapes loaders, mIoU by hand, and the camvid task through the command line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from reference import randomize_bn, reference_forward, rel_err
from torch import nn

from disco.cli import main
from disco.cost import estimate
from disco.data.seg import IGNORE, SegEvalSet, SegTrainLoader, find_layout, read_pair, split_pairs
from disco.graph import partition
from disco.graph.capture import capture
from disco.graph.ops import Local
from disco.masks import DiscoModel
from disco.models import build_model
from disco.runtime.export import export
from disco.runtime.local import simulate
from disco.tasks import get_task
from disco.tasks.seg import confusion, seg_metrics

CAMVID = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "camvid"
SHAPE = (1, 3, 60, 76)  # not a multiple of 16: the resizes to the low-level and input sizes are exercised


@pytest.fixture(autouse=True)
def _one_thread():
    """Small convolutions run faster on one thread (much faster on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _randomized(name: str = "deeplabv3plus_test", seed: int = 0, **kw) -> nn.Module:
    """A model with random BatchNorm statistics and affine terms (so that no block is an identity)."""
    torch.manual_seed(seed)
    return randomize_bn(build_model(name, **kw), seed)


# ---- the model ----------------------------------------------------------------------------

@pytest.mark.parametrize("os_,high", [(16, 4), (8, 8)])
def test_deeplab_output_stride_and_output_size(os_: int, high: int) -> None:
    model = build_model("deeplabv3plus_test", output_stride=os_)
    low, feat = model.backbone(torch.zeros(1, 3, 64, 64))
    assert low.shape[-2:] == (16, 16) and feat.shape[-2:] == (high, high)
    assert model(torch.zeros(2, 3, *SHAPE[2:])).shape == (2, 5, *SHAPE[2:])
    rates = [m[0].dilation[0] for m in model.aspp.convs[1:4]]
    assert rates == ([1, 2, 3] if os_ == 16 else [2, 4, 6])  # doubled at output stride 8


def test_encoder_keys_follow_torchvision_resnet50(tmp_path: Path) -> None:
    import torchvision

    from disco.models.deeplab import load_backbone

    with torch.device("meta"):
        ours = build_model("deeplabv3plus_resnet50").backbone.state_dict()
        tv = torchvision.models.resnet50().state_dict()
    tv = {k: v for k, v in tv.items() if not k.startswith("fc.")}
    assert set(tv) == set(ours) and all(tv[k].shape == ours[k].shape for k in tv)
    # a classification state dict initialises the encoder (here a test model's own, saved and reloaded)
    src, dst = build_model("deeplabv3plus_test"), build_model("deeplabv3plus_test")
    torch.save({f"{k}": v for k, v in src.backbone.state_dict().items()} | {"fc.weight": torch.zeros(3)},
               tmp_path / "enc.pt")
    load_backbone(dst, tmp_path / "enc.pt")
    assert torch.equal(dst.backbone.layer4[0].conv2.weight, src.backbone.layer4[0].conv2.weight)
    with pytest.raises(ValueError, match="does not fit the encoder"):
        load_backbone(build_model("deeplabv3plus_tiny"), tmp_path / "enc.pt")


def test_partition_uses_the_general_rules() -> None:
    model = _randomized()
    part = partition(model, SHAPE, 2)
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    assert sorted(ly.name for ly in part.layers) == sorted(convs)  # every conv is a mixing layer, nothing else
    interp = [n.name for n in part.gm.graph.nodes if n.op == "call_function" and "interpolate" in str(n.target)]
    assert len(interp) == 3  # image-pooling branch, decoder upsampling, output upsampling
    assert all(isinstance(part.rules[n], Local) for n in interp)
    # the image-pooling branch runs on 1x1 planes: its links are cheap
    pool = part.layer("aspp.convs.4.1")
    assert part.links.values[pool.col_link[pool.col_link >= 0]].max() == 1


@pytest.mark.parametrize("n,os_", [(2, 16), (3, 16), (4, 16), (3, 8)])
def test_invariants_1_to_4(tmp_path: Path, n: int, os_: int) -> None:
    model = _randomized(seed=n, output_stride=os_)
    plain = copy.deepcopy(model)
    x = torch.randn(SHAPE)
    with torch.no_grad():
        ref = model(x)
    part = partition(model, x, n)
    dm = DiscoModel(model, part).eval()
    with torch.no_grad():
        assert rel_err(dm(x), ref) < 1e-5  # invariant 1: every link kept == the original model
    kept = np.random.default_rng(n).random(part.n_links) < 0.3
    dm.set_kept(kept)
    with torch.no_grad():
        out = dm(x)
    assert rel_err(out, reference_forward(part, capture(plain, x), kept, x)) < 1e-5  # the masks = activation masking
    assert rel_err(out, ref) > 1e-3  # and they do change the function
    got, trs = simulate(part, kept, x, timeout=20)
    rep = estimate(part, kept)
    assert rel_err(got, out) < 1e-4  # invariant 2
    assert sum(t.payload_bytes for t in trs) == rep.bytes  # invariant 3
    man = export(dm, part, kept, tmp_path, {"name": "deeplabv3plus_test", "kwargs": {"output_stride": os_}})
    assert [s["params"] for s in man["shards"]] == rep.params_per_node  # invariant 4
    assert sum(rep.params_per_node) < rep.params_dense  # the masked columns are not stored


@pytest.mark.slow
def test_cost_cli_resnet50_512(capsys) -> None:
    assert main(["cost", "deeplabv3plus_resnet50", "--nodes", "2", "--input-shape", "1,3,512,512", "--json"]) == 0
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert d["nodes"] == 2 and d["ratio"] == 1.0 and d["input_shape"] == [1, 3, 512, 512]
    assert 39e6 < d["params_dense"] < 42e6  # DeepLabV3+ ResNet-50, 11 classes: about 40.3 M
    assert d["bytes"] == d["dense_bytes"] > 0 and len(d["params_per_node"]) == 2


# ---- metric and losses --------------------------------------------------------------------

def test_miou_by_hand_with_a_void_pixel() -> None:
    target = torch.tensor([[0, 0, 1], [1, 2, IGNORE]])
    pred = torch.tensor([[0, 1, 1], [1, 0, 2]])  # the void pixel's prediction must not count
    conf = confusion(pred, target, 3)
    assert conf.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    m = seg_metrics(conf, ("a", "b", "c"))
    # IoU a = 1 / (2 + 2 - 1) = 1/3, b = 2 / (2 + 3 - 2) = 2/3, c = 0 / (1 + 0 - 0) = 0
    assert m["iou_a"] == pytest.approx(100 / 3) and m["iou_b"] == pytest.approx(200 / 3) and m["iou_c"] == 0.0
    assert m["miou"] == pytest.approx(100 / 3)
    assert m["pixel_acc"] == pytest.approx(60.0)  # 3 of the 5 labelled pixels
    absent = seg_metrics(confusion(torch.tensor([0, 1]), torch.tensor([0, 1]), 3), ("a", "b", "c"))
    assert np.isnan(absent["iou_c"]) and absent["miou"] == pytest.approx(100.0)  # an absent class has no IoU


def test_evaluate_upsamples_logits_to_the_full_label_resolution() -> None:
    task = get_task("camvid")

    class Half(nn.Module):  # predicts class 3 left, class 0 right, at half the label resolution
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(x.shape[0], 11, 2, 2)
            out[:, 3, :, 0] = 5
            out[:, 0, :, 1] = 5
            return out

    y = torch.full((1, 4, 4), 3)
    y[:, :, 2:] = 0
    y[0, 0, 0] = IGNORE
    m = task.evaluate(Half(), [(torch.zeros(1, 3, 2, 2), y)])
    assert m["pixel_acc"] == 100.0 and m["iou_road"] == 100.0 and m["iou_sky"] == 100.0 and m["n"] == 1
    assert m["miou"] == 100.0 and np.isnan(m["iou_car"])


def test_distillation_is_zero_for_the_teacher_and_positive_otherwise() -> None:
    task = get_task("camvid")
    t = torch.randn(2, 11, 4, 5)
    assert float(task.distill(t, t)) == pytest.approx(0.0, abs=1e-6)
    assert float(task.distill(torch.randn(2, 11, 4, 5), t)) > 0.01
    y = torch.randint(0, 11, (2, 4, 5))
    y[0, 0, 0] = IGNORE
    assert torch.isfinite(task.loss(t, y))


# ---- loaders ------------------------------------------------------------------------------

def _png(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def _fake_camvid(root: Path, n: int = 3, h: int = 48, w: int = 64) -> Path:
    """A full-CamVid-style folder (the CamVid folder itself), labels 0..11 with 11 = void."""
    rng = np.random.default_rng(0)
    for split in ("train", "val", "test"):
        for k in range(n):
            lab = rng.integers(0, 12, (h, w)).astype(np.uint8)
            img = np.repeat((lab * 20)[..., None], 3, 2).astype(np.uint8)  # a learnable cue
            _png(root / split / f"seq_{k:04d}.png", img)
            _png(root / f"{split}annot" / f"seq_{k:04d}.png", lab)
    return root


def test_camvid_layout_and_void(tmp_path: Path) -> None:
    root = _fake_camvid(tmp_path / "CamVid")
    for data in (tmp_path, root):
        lay = find_layout(data)
        assert lay.kind == "camvid" and lay.root == root
    img, lab = read_pair(*split_pairs(find_layout(root), "test")[0], num_classes=11)
    raw = np.asarray(Image.open(root / "testannot" / "seq_0000.png"))
    assert img.shape == (3, 48, 64) and lab.dtype == torch.uint8
    assert ((lab.numpy() == IGNORE) == (raw == 11)).all() and (lab.numpy()[raw < 11] == raw[raw < 11]).all()
    (root / "valannot" / "seq_0001.png").unlink()
    with pytest.raises(FileNotFoundError, match="label file"):
        split_pairs(find_layout(root), "val")
    with pytest.raises(FileNotFoundError, match="neither a CamVid folder"):
        find_layout(tmp_path / "CamVid" / "test")


def test_cityscapes_layout(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for city, k in (("aachen", 0), ("bonn", 1)):
            stem = f"{city}_000000_00000{k}"
            _png(tmp_path / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png",
                 rng.integers(0, 255, (32, 64, 3)).astype(np.uint8))
            lab = rng.integers(0, 19, (32, 64)).astype(np.uint8)
            lab[0, :5] = 255
            _png(tmp_path / "gtFine" / split / city / f"{stem}_gtFine_labelTrainIds.png", lab)
    task = get_task("cityscapes")
    train, test = task.loaders(str(tmp_path), 2)
    x, y = next(iter(train))
    assert x.shape == (2, 3, *task.crop) and y.shape == (2, *task.crop)
    xs, ys = next(iter(test))
    assert xs.shape == (2, 3, 8, 16) and ys.shape == (2, 32, 64)  # input at 1/4, labels at full resolution
    assert (ys[:, 0, :5] == IGNORE).all() and int(ys[ys != IGNORE].max()) <= 18
    with pytest.raises(ValueError, match="use --task cityscapes"):
        get_task("camvid").loaders(str(tmp_path), 2)


def test_train_loader_augments_and_keeps_batches(tmp_path: Path) -> None:
    root = _fake_camvid(tmp_path / "CamVid", n=5)
    tl = SegTrainLoader(root, 11, batch_size=2, crop=(32, 40), base_scale=0.5, scale_range=(0.75, 1.5))
    assert len(tl) == 2  # 5 images, batches of 2, the partial one dropped
    batches = list(tl)
    assert len(batches) == 2 and all(x.shape == (2, 3, 32, 40) and y.shape == (2, 32, 40) for x, y in batches)
    assert all(((y == IGNORE) | (y < 11)).all() for _, y in batches)
    assert any((y == IGNORE).any() for _, y in batches)  # void pixels (and padding) are ignored
    one = SegTrainLoader(root, 11, batch_size=8, crop=(16, 16), limit=1)
    assert len(one) == 1 and next(iter(one))[0].shape[0] == 8  # fewer images than a batch: they repeat


@pytest.mark.data
def test_camvid_shared_data() -> None:
    if not (CAMVID / "CamVid" / "train").is_dir():
        pytest.skip(f"shared CamVid not found at {CAMVID} (needs ../shared/data/camvid)")
    lay = find_layout(CAMVID)
    assert [len(split_pairs(lay, s)) for s in ("train", "val", "test")] == [123, 34, 78]
    task = get_task("camvid")
    train, test = task.loaders(str(CAMVID), 2, limit=3)
    x, y = next(iter(test))
    assert x.shape == (3, 3, 180, 240) and y.shape == (3, 360, 480)  # model at 240x180, labels at 480x360
    assert set(torch.unique(y).tolist()) <= set(range(11)) | {IGNORE} and (y == IGNORE).any()
    xt, yt = next(iter(train))
    assert xt.shape == (2, 3, 176, 224) and yt.shape == (2, 176, 224)
    assert abs(float(xt.permute(1, 0, 2, 3)[:, yt != IGNORE].mean())) < 1.5  # normalised
    assert isinstance(test, SegEvalSet) and len(test) == 1


def _committed_seg() -> list[dict]:
    f = Path(__file__).resolve().parents[1] / "results" / "seg_deeplabv3plus.json"
    return [e for e in json.loads(f.read_text()) if e.get("checkpoint")] if f.is_file() else []


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("entry", _committed_seg(), ids=lambda e: e["name"])
def test_committed_seg_checkpoint_reproduces_miou(entry: dict, capsys) -> None:
    """The committed CamVid checkpoints give the mIoU that results/seg_deeplabv3plus.json (and the README) report."""
    if not (CAMVID / "CamVid" / "test").is_dir():
        pytest.skip(f"shared CamVid not found at {CAMVID} (needs ../shared/data/camvid)")
    ckpt = Path(__file__).resolve().parents[1] / entry["checkpoint"]
    assert ckpt.is_file(), f"{ckpt} is named in results/seg_deeplabv3plus.json but missing"
    assert main(["eval", str(ckpt), "--data", str(CAMVID), "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(got["miou"] - entry["miou"]) <= 0.01 and abs(got["pixel_acc"] - entry["pixel_acc"]) <= 0.01


# ---- the task through the command line ----------------------------------------------------

def test_train_sparsify_eval_camvid_cli(tmp_path: Path, capsys) -> None:
    data = _fake_camvid(tmp_path / "data" / "CamVid", n=4, h=36, w=48).parent
    dense = tmp_path / "dense.safetensors"

    def last() -> dict:
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert main(["train", "--task", "camvid", "--data", str(data), "--model", "deeplabv3plus_test", "--epochs", "1",
                 "--batch-size", "2", "--out", str(dense)]) == 0
    d = last()
    assert 0 <= d["miou"] <= 100 and 0 <= d["pixel_acc"] <= 100 and d["n"] == 4
    sp = tmp_path / "n2.safetensors"
    assert main(["sparsify", str(dense), "--data", str(data), "--nodes", "2", "--ratio", "0.1", "--epochs", "1",
                 "--batch-size", "2", "--distill", "0.5", "--out", str(sp)]) == 0
    s = last()
    assert abs(s["ratio"] - 0.1) <= 0.02 and s["nodes"] == 2 and "iou_road" in s
    assert main(["eval", str(sp), "--data", str(data), "--json"]) == 0
    e = last()
    assert e["task"] == "camvid" and e["miou"] == pytest.approx(s["miou"], abs=1e-9)
