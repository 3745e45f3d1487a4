"""Super-resolution: metrics by hand, loaders on synthetic folders, the task through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from disco.data.sr import SRTrainLoader, bicubic_down, bicubic_up, image_files, modcrop, read_rgb, sr_folders
from disco.tasks import get_task
from disco.tasks.sr import gaussian_1d, psnr_y, rgb_to_y, ssim_y

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _one_thread():
    """These small convolutions and interpolations run faster on one thread (much faster on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---- metrics ------------------------------------------------------------------------------

def test_rgb_to_y_bt601():
    black, white = torch.zeros(1, 3, 2, 2), torch.ones(1, 3, 2, 2)
    assert torch.allclose(rgb_to_y(black), torch.full((1, 1, 2, 2), 16.0, dtype=torch.float64))
    assert torch.allclose(rgb_to_y(white), torch.full((1, 1, 2, 2), 235.0, dtype=torch.float64))
    red = torch.zeros(1, 3, 1, 1)
    red[0, 0] = 1
    assert rgb_to_y(red).item() == pytest.approx(16 + 65.481)


def test_psnr_known_mse():
    torch.manual_seed(0)
    hr = torch.rand(1, 3, 20, 20, dtype=torch.float64) * 0.5 + 0.25
    d = 2 / 219  # the same offset on R, G and B moves Y by d * 219 = 2 -> MSE 4
    sr = hr + d
    assert psnr_y(sr, hr) == pytest.approx(10 * math.log10(255 ** 2 / 4), abs=1e-9)
    assert psnr_y(hr, hr) == math.inf


def test_psnr_shaves_the_border():
    hr = torch.full((1, 3, 12, 12), 0.5)
    sr = hr.clone()
    sr[..., :4, :] = 0.0  # errors only in the top 4 rows
    assert psnr_y(sr, hr, border=4) == math.inf
    assert psnr_y(sr, hr, border=3) < 30


def test_ssim_identical_is_one_and_drops_with_noise():
    torch.manual_seed(0)
    hr = torch.rand(1, 3, 32, 32)
    assert ssim_y(hr, hr) == pytest.approx(1.0, abs=1e-12)
    noise = torch.randn_like(hr)
    s1, s3 = ssim_y((hr + 0.1 * noise).clamp(0, 1), hr), ssim_y((hr + 0.3 * noise).clamp(0, 1), hr)
    assert s3 < s1 < 0.99


def _ssim_reference(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM (Wang et al. 2004) written out window by window: the formula, no convolution."""
    x = np.arange(11) - 5.0
    g = np.exp(-(x ** 2) / (2 * 1.5 ** 2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    vals = []
    for i in range(a.shape[0] - 10):
        for j in range(a.shape[1] - 10):
            pa, pb = a[i:i + 11, j:j + 11], b[i:i + 11, j:j + 11]
            ma, mb = (w * pa).sum(), (w * pb).sum()
            va, vb = (w * (pa - ma) ** 2).sum(), (w * (pb - mb) ** 2).sum()
            cov = (w * (pa - ma) * (pb - mb)).sum()
            vals.append((2 * ma * mb + c1) * (2 * cov + c2) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2)))
    return float(np.mean(vals))


def test_ssim_matches_the_formula_window_by_window():
    torch.manual_seed(1)
    hr = torch.rand(1, 3, 18, 17)
    sr = (hr * 0.8 + 0.2 * torch.rand_like(hr)).clamp(0, 1)
    ya, yb = rgb_to_y(sr)[0, 0, 2:-2, 2:-2].numpy(), rgb_to_y(hr)[0, 0, 2:-2, 2:-2].numpy()
    assert ssim_y(sr, hr, border=2) == pytest.approx(_ssim_reference(ya, yb), abs=1e-10)
    assert gaussian_1d().sum().item() == pytest.approx(1.0)


# ---- data -----------------------------------------------------------------------------------

def _write_images(folder: Path, sizes: list[tuple[int, int]], seed: int = 0, exts: tuple[str, ...] = (".png",),
                  gray: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, (w, h) in enumerate(sizes):
        # smooth content (a blurred random field), so that LR and HR are visibly related
        base = rng.random((h // 8 + 2, w // 8 + 2, 3))
        img = Image.fromarray((base * 255).astype(np.uint8)).resize((w, h), Image.BICUBIC)
        if gray and i == 0:
            img = img.convert("L")
        img.save(folder / f"img{i}{exts[i % len(exts)]}")


@pytest.fixture
def sr_data(tmp_path: Path) -> Path:
    """A tiny --data folder: t91/HR (bmp, png, jpg), set5/HR with a grayscale image, set14/HR."""
    _write_images(tmp_path / "t91" / "HR", [(130, 110), (100, 97), (60, 60)], exts=(".bmp", ".png", ".jpg"))
    _write_images(tmp_path / "set5" / "HR", [(50, 42), (64, 64)], seed=1, gray=True)
    _write_images(tmp_path / "set14" / "HR", [(41, 39)], seed=2)
    return tmp_path


def test_image_folder_and_modcrop(sr_data):
    files = image_files(sr_data / "t91")
    assert [p.suffix for p in files] == [".bmp", ".png", ".jpg"]
    gray = read_rgb(image_files(sr_data / "set5")[0])
    assert gray.shape == (3, 42, 50) and gray.dtype == torch.uint8
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])
    assert modcrop(gray, 4).shape == (3, 40, 48)
    train, evals = sr_folders(sr_data)
    assert train == sr_data / "t91" and set(evals) == {"set5", "set14"}


def test_bicubic_down_up_are_8bit_and_sized():
    torch.manual_seed(0)
    hr = torch.rand(2, 3, 16, 24)
    lr = bicubic_down(hr, 4)
    assert lr.shape == (2, 3, 4, 6) and lr.min() >= 0 and lr.max() <= 1
    assert torch.equal(lr, torch.round(lr * 255) / 255)
    assert bicubic_up(lr, 4).shape == hr.shape
    flat = torch.full((1, 3, 8, 8), 0.4)
    assert torch.allclose(bicubic_down(flat, 2), torch.round(flat[..., :4, :4] * 255) / 255)
    with pytest.raises(ValueError, match="modcrop"):
        bicubic_down(torch.rand(1, 3, 10, 10), 4)


def test_train_patches_are_aligned_and_augmented(sr_data):
    loader = SRTrainLoader(sr_data / "t91", scale=4, patch=6, batch_size=5, seed=0)
    assert len(loader.pairs) == 3  # 60x60 >= the 24x24 HR patch
    big = SRTrainLoader(sr_data / "t91", scale=4, patch=24, batch_size=5)
    assert len(big.pairs) == 2  # the 96x96 HR patch skips the 60x60 image (and the modcropped 100x96 fits)
    batches = list(loader)
    assert len(batches) == len(loader) and sum(len(y) for _, y in batches) == loader.patches_per_epoch
    lr, hr = loader.sample(64)
    assert lr.shape == (64, 3, 6, 6) and hr.shape == (64, 3, 24, 24)
    assert 0 <= float(lr.min()) and float(hr.max()) <= 1
    # the LR patch is the bicubic LR of the HR image at the same place: close to the HR patch's 4x4 means,
    # much closer than to the means of a shifted patch (an augmentation applied to one side only would fail)
    means = torch.nn.functional.avg_pool2d(hr, 4)
    err = (means - lr).abs().mean()
    assert err < 0.03
    assert err < 0.5 * (means.flip(3) - lr).abs().mean()
    assert err < 0.5 * (means.transpose(2, 3) - lr).abs().mean()


# ---- the task -------------------------------------------------------------------------------

class _Bicubic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bicubic_up(x, 4)


def test_task_registered_and_evaluates(sr_data):
    task = get_task("sr_x4")
    assert task.input_shape == (1, 3, 24, 24) and task.default_model == "rrdbnet_tiny"
    assert get_task("sr_x2").scale == 2
    train, test = task.loaders(str(sr_data), batch_size=4)
    x, y = train.sample(4)
    assert x.shape == (4, 3, 24, 24) and y.shape == (4, 3, 96, 96)
    m = task.evaluate(_Bicubic(), test)
    assert m["n"] == 3
    for s in ("set5", "set14"):
        assert m[f"psnr_{s}"] == pytest.approx(m[f"bicubic_psnr_{s}"])
        assert m[f"ssim_{s}"] == pytest.approx(m[f"bicubic_ssim_{s}"])
    assert "psnr_bsd100" not in m
    out = torch.rand(2, 3, 8, 8, requires_grad=True)
    assert task.loss(out, out.detach()).item() == 0
    assert task.distill(out, out.detach() + 0.5).item() == pytest.approx(0.5)


def test_train_sparsify_eval_through_the_cli(sr_data, tmp_path, capsys):
    from disco.cli import main

    dense, sparse = tmp_path / "dense.safetensors", tmp_path / "n2.safetensors"
    assert main(["train", "--task", "sr_x4", "--data", str(sr_data), "--epochs", "1", "--batch-size", "4",
                 "--out", str(dense)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"psnr_set5", "ssim_set5", "bicubic_psnr_set14"} <= set(res)
    assert main(["sparsify", str(dense), "--data", str(sr_data), "--nodes", "2", "--ratio", "0.1", "--epochs", "1",
                 "--batch-size", "4", "--distill", "0.5", "--out", str(sparse)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["ratio"] == pytest.approx(0.1, abs=0.02) and res["nodes"] == 2 and "psnr_set14" in res
    assert main(["eval", str(sparse), "--data", str(sr_data), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["task"] == "sr_x4" and ev["psnr_set5"] == pytest.approx(res["psnr_set5"])


# ---- the shared data (skipped when ../shared/data is absent) --------------------------------

@pytest.fixture
def shared_sr() -> Path:
    if not all((SHARED / n / "HR").is_dir() for n in ("t91", "set5", "set14", "bsd100")):
        pytest.skip(f"shared SR data not found under {SHARED} (needs t91, set5, set14, bsd100)")
    return SHARED


@pytest.mark.data
def test_bicubic_baseline_matches_the_published_numbers(shared_sr):
    """Set5/Set14 x4 bicubic: published 28.42 dB / 0.8104 and 26.00 dB / 0.7027 (MATLAB imresize)."""
    task = get_task("sr_x4")
    _, test = task.loaders(str(shared_sr), limit=None)
    test.sets.pop("bsd100")  # 25.96 dB published; the slowest set, measured by the recipe
    m = task.evaluate(_Bicubic(), test)
    assert m["bicubic_psnr_set5"] == pytest.approx(28.42, abs=0.05)
    assert m["bicubic_ssim_set5"] == pytest.approx(0.8104, abs=0.003)
    assert m["bicubic_psnr_set14"] == pytest.approx(26.0, abs=0.15)
    assert m["bicubic_ssim_set14"] == pytest.approx(0.7027, abs=0.005)


@pytest.mark.data
def test_shared_t91_patches(shared_sr):
    loader = SRTrainLoader(shared_sr / "t91", scale=4, patch=24, batch_size=16)
    assert len(loader.pairs) == 90  # one of the 91 images (78 px) is smaller than a 96x96 patch
    assert len(loader) == math.ceil(loader.patches_per_epoch / 16)
    lr, hr = next(iter(loader))
    assert lr.shape == (16, 3, 24, 24) and hr.shape == (16, 3, 96, 96)


def test_rrdbnet_partition_fingerprint_is_stable_across_processes():
    """A DISCO checkpoint made in one process must load in another: the graph hash may not hold addresses
    (``str(torch.cat)`` does), so the fingerprint is the same in a fresh interpreter."""
    import os
    import subprocess
    import sys

    from disco.graph import partition
    from disco.models import build_model

    code = ("from disco.models import build_model; from disco.graph import partition; "
            "print(partition(build_model('rrdbnet_tiny'), (1, 3, 24, 24), 2).fingerprint())")
    env = os.environ | {"PYTHONHASHSEED": "123", "OMP_NUM_THREADS": "1"}
    other = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env)
    here = partition(build_model("rrdbnet_tiny"), (1, 3, 24, 24), 2).fingerprint()
    assert other.stdout.strip() == here


def _committed_sr():
    f = Path(__file__).resolve().parents[1] / "results" / "sr_rrdbnet.json"
    return [e for e in json.loads(f.read_text()) if e.get("checkpoint")] if f.is_file() else []


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("entry", _committed_sr(), ids=lambda e: e["name"])
def test_committed_sr_checkpoint_reproduces_psnr(entry, shared_sr, capsys):
    """The committed SR checkpoints give the PSNR that results/sr_rrdbnet.json (and the README) report."""
    from disco.cli import main

    ckpt = Path(__file__).resolve().parents[1] / entry["checkpoint"]
    assert ckpt.is_file(), f"{ckpt} is named in results/sr_rrdbnet.json but missing"
    assert main(["eval", str(ckpt), "--data", str(shared_sr), "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for k in ("psnr_set5", "psnr_set14", "psnr_bsd100"):
        assert abs(got[k] - entry[k]) <= 0.01, k
