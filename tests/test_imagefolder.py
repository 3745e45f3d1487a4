"""The image-folder task: layout, archives, bad input, weights files, devices, through the CLI."""

import json
import logging
import tarfile

import numpy as np
import pytest
import torch

from disco.cli import main
from disco.data import imagefolder as F
from disco.models import build_model

SIZE = 20


def make_image_folder(root, classes=3, per_class=6, val_per_class=3, size=SIZE, seed=0):
    """A tiny ImageFolder tree (train/ and val/) whose classes differ by a colour cue."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            d = root / split / f"class{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                a = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
                a[..., c % 3] = 200
                Image.fromarray(a).save(d / f"img{i}.jpg", quality=90)
    return root


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    return make_image_folder(tmp_path / "data")


def _json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _err(capsys):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err


def _train(folder, out, *extra):
    return main(["train", "--task", "imagefolder", "--data", str(folder), "--model", "cifar_resnet8",
                 "--image-size", "16", "--epochs", "1", "--batch-size", "8", "--workers", "0", "--device", "cpu",
                 "--out", str(out), *extra])


def test_train_sparsify_eval_top5(folder, tmp_path, capsys):
    dense = tmp_path / "dense.safetensors"
    assert _train(folder, dense) == 0
    d = _json(capsys)
    assert d["n"] == 9 and {"top1", "top5"} <= set(d)
    assert d["top5"] == 100.0  # 3 classes: the top 5 hold every class
    sp = tmp_path / "sp.safetensors"
    assert main(["sparsify", str(dense), "--data", str(folder), "--nodes", "2", "--ratio", "0.2", "--epochs", "1",
                 "--batch-size", "8", "--workers", "0", "--out", str(sp)]) == 0
    s = _json(capsys)
    assert s["nodes"] == 2 and abs(s["ratio"] - 0.2) < 0.05
    assert main(["eval", str(sp), "--data", str(folder), "--workers", "0", "--json"]) == 0
    e = _json(capsys)
    assert e["top1"] == pytest.approx(s["top1"]) and e["n"] == 9


def test_class_count_and_image_size_from_folder(folder, tmp_path, capsys):
    from disco.checkpoint import load_checkpoint

    dense = tmp_path / "d.safetensors"
    assert _train(folder, dense) == 0
    ck = load_checkpoint(dense)
    assert ck.model["kwargs"] == {"num_classes": 3} and ck.input_shape == [1, 3, 16, 16]
    assert ck.info["classes"] == ["class0", "class1", "class2"]


def test_archives_unpacked_once_into_cache(tmp_path, monkeypatch, capsys):
    src = make_image_folder(tmp_path / "src")
    data = tmp_path / "tars"
    data.mkdir()
    for split in ("train", "val"):
        with tarfile.open(data / f"{split}.tar", "w") as tf:
            tf.add(src / split, arcname=split)
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    d1 = F.split_dir(data, "train")
    assert d1.is_dir() and (tmp_path / "cache") in d1.parents
    assert sorted(p.name for p in d1.iterdir()) == ["class0", "class1", "class2"]
    assert F.split_dir(data, "train") == d1  # second call: the cache, no second copy
    assert len(list((tmp_path / "cache").iterdir())) == 1
    assert sorted(p.name for p in data.iterdir()) == ["train.tar", "val.tar"]  # nothing written beside the data
    assert _train(data, tmp_path / "x.safetensors") == 0


def test_no_class_folders(tmp_path, capsys):
    (tmp_path / "d" / "train").mkdir(parents=True)
    (tmp_path / "d" / "val").mkdir()
    (tmp_path / "d" / "train" / "a.jpg").write_bytes(b"x")
    assert _train(tmp_path / "d", tmp_path / "x.safetensors") == 2
    err = _err(capsys)
    assert "no class subfolders" in err and "train" in err and len(err.splitlines()) == 1


def test_missing_split(tmp_path, capsys):
    make_image_folder(tmp_path / "d")
    import shutil

    shutil.rmtree(tmp_path / "d" / "val")
    assert _train(tmp_path / "d", tmp_path / "x.safetensors") == 2
    assert "no val/ folder" in _err(capsys)


def test_empty_class(folder, tmp_path, capsys):
    empty = folder / "train" / "class9"
    empty.mkdir()
    (empty / "notes.txt").write_text("not an image")
    assert _train(folder, tmp_path / "x.safetensors") == 2
    err = _err(capsys)
    assert "class9" in err and "holds no image" in err


def test_corrupt_image_skipped_with_count(folder, caplog):
    bad = folder / "train" / "class1" / "img0.jpg"
    bad.write_bytes(b"\xff\xd8 this is not a jpeg")
    (folder / "train" / "class1" / "readme.txt").write_text("ignored: not an image extension")
    ds = F.SkippingImageFolder(folder / "train", F.find_classes(folder / "train"), F.transforms(16, False))
    assert len(ds) == 18  # the .txt is not a sample
    loader = F.ImageFolderLoader(ds, 4, False, 0, list(range(len(ds))))
    with caplog.at_level(logging.WARNING):
        batches = list(loader)
    assert sum(len(y) for _, y in batches) == 18  # the bad one was replaced, batch sizes kept
    msgs = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(msgs) == 1 and "skipped 1 unreadable" in msgs[0] and "img0.jpg" in msgs[0]


def test_grayscale_and_cmyk_jpeg_become_rgb(tmp_path):
    from PIL import Image

    d = tmp_path / "train" / "a"
    d.mkdir(parents=True)
    Image.new("L", (24, 24), 128).save(d / "gray.jpg")
    Image.new("CMYK", (24, 24), (0, 255, 255, 0)).save(d / "cmyk.jpg")
    Image.new("RGBA", (24, 24), (1, 2, 3, 4)).save(d / "rgba.png")
    ds = F.SkippingImageFolder(tmp_path / "train", ["a"], F.transforms(16, False))
    for i in range(3):
        x, y, bad = ds[i]
        assert x.shape == (3, 16, 16) and not bad
    cmyk = [ds[i][0] for i in range(3) if ds.samples[i][0].endswith("cmyk.jpg")][0]
    assert cmyk[0].mean() > cmyk[1].mean()  # CMYK (0, 255, 255, 0) is red


def test_weights_of_another_architecture(folder, tmp_path, capsys):
    w = tmp_path / "other.pth"
    torch.save(build_model("cifar_resnet20", num_classes=3).state_dict(), w)
    assert _train(folder, tmp_path / "x.safetensors", "--weights", str(w)) == 2
    err = _err(capsys)
    assert "do not fit" in err and "unexpected" in err and "layer1.1" in err


def test_weights_head_resized_only_when_asked(folder, tmp_path, capsys):
    from safetensors.torch import save_file

    src = build_model("cifar_resnet8", num_classes=7)
    w = tmp_path / "seven.safetensors"
    save_file(src.state_dict(), str(w))
    assert _train(folder, tmp_path / "x.safetensors", "--weights", str(w)) == 2
    err = _err(capsys)
    assert "7-class head" in err and "--num-classes 3" in err
    out = tmp_path / "y.safetensors"
    assert _train(folder, out, "--weights", str(w), "--num-classes", "3", "--epochs", "0") == 0
    from disco.checkpoint import load_checkpoint

    got, want = load_checkpoint(out).state_dict, src.state_dict()
    body = [k for k in want if not k.startswith("fc.")]
    assert body and all(torch.equal(got[k], want[k]) for k in body)  # the body came from the file
    assert got["fc.weight"].shape[0] == 3


def test_damaged_weights_file(folder, tmp_path, capsys):
    w = tmp_path / "broken.pth"
    w.write_bytes(b"not a pickle")
    assert _train(folder, tmp_path / "x.safetensors", "--weights", str(w)) == 2
    assert "cannot be read" in _err(capsys)


def test_cuda_without_gpu_and_amp_on_cpu(folder, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert _train(folder, tmp_path / "x.safetensors", "--device", "cuda") == 2
    err = _err(capsys)
    assert "no CUDA GPU" in err and len(err.splitlines()) == 1
    assert _train(folder, tmp_path / "x.safetensors", "--amp", "bf16") == 2
    assert "needs a CUDA device" in _err(capsys)


def test_eval_refuses_other_classes(folder, tmp_path, capsys):
    dense = tmp_path / "d.safetensors"
    assert _train(folder, dense) == 0
    capsys.readouterr()
    other = make_image_folder(tmp_path / "other", classes=4)
    assert main(["eval", str(dense), "--data", str(other), "--workers", "0", "--json"]) == 2
    assert "not the ones the checkpoint was trained on" in _err(capsys)


def test_interrupted_state_is_resumed(folder, tmp_path, capsys):
    """A state file from an earlier (interrupted) run is picked up; a damaged one is refused by name."""
    out = tmp_path / "r.safetensors"
    assert _train(folder, out, "--epochs", "1") == 0
    state = tmp_path / "r.safetensors.state.pt"
    assert state.is_file() and not (tmp_path / "r.safetensors.state.pt.tmp").exists()
    assert _train(folder, out, "--epochs", "2") == 0  # resumes after epoch 1
    from disco.checkpoint import load_checkpoint

    assert [h["epoch"] for h in load_checkpoint(out).info["history"]] == [1, 2]
    state.write_bytes(state.read_bytes()[:100])
    assert _train(folder, out, "--epochs", "3") == 2
    assert "cannot resume from" in _err(capsys)
