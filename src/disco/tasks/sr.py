"""Single-image super-resolution (x4, x2): L1 loss, PSNR/SSIM on Y beside the bicubic baseline.

Metric protocol (the usual MATLAB-compatible one): the SR output is clamped and rounded to
8 bits, both images go to the Y channel of ITU-R BT.601 (``Y = 16 + 65.481 R + 128.553 G +
24.966 B`` with RGB in [0, 1], so Y is in [16, 235], not rounded), ``scale`` pixels are shaved
from every border, then PSNR (peak 255) and SSIM (Wang et al. 2004: 11x11 Gaussian window,
sigma 1.5, K1 = 0.01, K2 = 0.03, L = 255, valid positions only) are averaged over the images
of each set. The bicubic baseline upsamples the same LR input (see ``disco.data.sr``).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from ..data.sr import SREvalSets, SRTrainLoader, bicubic_up, quantize, sr_folders, to_float
from ..errors import RefusedError
from .registry import register_task

log = logging.getLogger(__name__)


def rgb_to_y(x: Tensor) -> Tensor:
    """BT.601 luma of RGB in [0, 1] (N,3,H,W) -> (N,1,H,W) in [16, 235], float64."""
    w = torch.tensor([65.481, 128.553, 24.966], dtype=torch.float64).view(1, 3, 1, 1)
    return 16.0 + (x.double() * w).sum(1, keepdim=True)


def shave(x: Tensor, border: int) -> Tensor:
    """Drop ``border`` pixels at each side of the last two dims."""
    return x[..., border:x.shape[-2] - border, border:x.shape[-1] - border] if border > 0 else x


def psnr_y(sr: Tensor, hr: Tensor, border: int = 0) -> float:
    """PSNR (dB, peak 255) on the Y channel of one RGB image pair in [0, 1], ``border`` shaved."""
    a, b = shave(rgb_to_y(sr), border), shave(rgb_to_y(hr), border)
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)


def gaussian_1d(size: int = 11, sigma: float = 1.5) -> Tensor:
    """The normalised 1-D Gaussian whose outer product is SSIM's window."""
    g = torch.exp(-((torch.arange(size, dtype=torch.float64) - (size - 1) / 2) ** 2) / (2 * sigma ** 2))
    return g / g.sum()


def _filter(x: Tensor, g: Tensor) -> Tensor:
    """Valid 2-D filtering with the separable window ``g g^T`` (two 1-D passes)."""
    k = len(g)
    return F.conv2d(F.conv2d(x, g.view(1, 1, k, 1)), g.view(1, 1, 1, k))


def ssim_map(a: Tensor, b: Tensor, data_range: float = 255.0) -> Tensor:
    """SSIM map of two single-channel images (N,1,H,W) over valid 11x11 Gaussian windows."""
    g = gaussian_1d().to(a.dtype)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    mu_a, mu_b = _filter(a, g), _filter(b, g)
    saa = _filter(a * a, g) - mu_a ** 2
    sbb = _filter(b * b, g) - mu_b ** 2
    sab = _filter(a * b, g) - mu_a * mu_b
    return ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (saa + sbb + c2))


def ssim_y(sr: Tensor, hr: Tensor, border: int = 0) -> float:
    """SSIM on the Y channel of one RGB image pair in [0, 1], ``border`` shaved."""
    return float(ssim_map(shave(rgb_to_y(sr), border), shave(rgb_to_y(hr), border)).mean())


class SuperResolution:
    """Shared implementation; subclasses fix the scale. ``--data`` is a folder as in ``disco.data.sr``."""

    name = "sr"
    scale = 4
    patch = 24  # LR training patch (HR patch = patch * scale)
    input_shape: tuple[int, ...] = (1, 3, 24, 24)  # the partition's shape: one LR training patch
    default_model = "rrdbnet_tiny"
    model_kwargs: dict[str, Any] = {"scale": 4}
    # optimiser defaults for disco train / disco sparsify (the usual PSNR-oriented recipe: Adam, L1)
    optimizer = "adam"
    lr = 1e-3  # short CPU runs; ESRGAN itself uses 2e-4 over ~1M steps
    finetune_lr = 5e-4
    weight_decay = 0.0

    def loaders(
        self, data: str, batch_size: int = 16, limit: int | None = None, seed: int = 0,
    ) -> tuple[Any, Any]:
        """Training patches and the evaluation sets; ``limit`` caps the images of every folder."""
        train_dir, eval_dirs = sr_folders(data)
        root = Path(data)
        if not eval_dirs and (root.name.lower() in ("set5", "set14", "bsd100") or (root / "HR").is_dir()):

            raise RefusedError(f"--data {data} is one evaluation set; pass the folder that holds it "
                             f"({root.parent}: set5/, set14/, bsd100/ and t91/ or train/)")
        if not eval_dirs:
            log.warning("%s holds none of %s: evaluation will be empty", data, ", ".join(("set5", "set14", "bsd100")))
        return (SRTrainLoader(train_dir, self.scale, self.patch, batch_size, limit=limit, seed=seed),
                SREvalSets(eval_dirs, self.scale, limit=limit))

    def loss(self, out: Tensor, target: Tensor) -> Tensor:
        return F.l1_loss(out, target)

    def distill(self, out: Tensor, teacher_out: Tensor) -> Tensor:
        return F.l1_loss(out, teacher_out)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Any) -> dict[str, float]:
        """PSNR/SSIM (Y, shaved) per set: ``psnr_set5``, ``ssim_set5``, ``bicubic_psnr_set5``, ..."""
        model.eval()
        if not isinstance(loader, SREvalSets):
            loader = _as_eval_sets(loader, self.scale)
        out: dict[str, float] = {}
        n = 0
        for name, pairs in loader.sets.items():
            bicubic = f"bicubic_psnr_{name}" not in loader.cache
            acc = dict.fromkeys(("psnr", "ssim", "bicubic_psnr", "bicubic_ssim") if bicubic else ("psnr", "ssim"), 0.0)
            for _, lr, hr in tqdm(pairs, desc=f"eval {name}", leave=False):
                x, y = to_float(lr), to_float(hr)
                sr = quantize(model(x))
                if sr.shape != y.shape:
                    raise ValueError(f"model output {tuple(sr.shape)} does not match HR {tuple(y.shape)} "
                                     f"(is the model built for x{self.scale}?)")
                acc["psnr"] += psnr_y(sr, y, self.scale)
                acc["ssim"] += ssim_y(sr, y, self.scale)
                if bicubic:
                    bic = bicubic_up(x, self.scale)
                    acc["bicubic_psnr"] += psnr_y(bic, y, self.scale)
                    acc["bicubic_ssim"] += ssim_y(bic, y, self.scale)
            k = max(len(pairs), 1)
            out.update({f"{m}_{name}": v / k for m, v in acc.items()})
            if bicubic:
                loader.cache.update({f"{m}_{name}": out[f"{m}_{name}"] for m in ("bicubic_psnr", "bicubic_ssim")})
            out.update({f"{m}_{name}": loader.cache[f"{m}_{name}"] for m in ("bicubic_psnr", "bicubic_ssim")})
            n += len(pairs)
            log.info("%s x%d: PSNR %.2f dB (bicubic %.2f), SSIM %.4f (bicubic %.4f)", name, self.scale,
                     out[f"psnr_{name}"], out[f"bicubic_psnr_{name}"], out[f"ssim_{name}"], out[f"bicubic_ssim_{name}"])
        out["n"] = float(n)
        return out


def _as_eval_sets(batches: Any, scale: int) -> SREvalSets:
    """Wrap an iterable of float ``(lr, hr)`` batches (e.g. ``disco run --data``) as one set ``data``."""
    sets = SREvalSets({}, scale)
    to_u8 = lambda t: t.clamp(0, 1).mul(255).round().to(torch.uint8)  # noqa: E731
    sets.sets["data"] = [(str(i), to_u8(lr[j]), to_u8(hr[j]))
                         for i, (lr, hr) in enumerate(batches) for j in range(len(lr))]
    return sets


@register_task
class SRx4(SuperResolution):
    name = "sr_x4"
    scale = 4
    model_kwargs: dict[str, Any] = {"scale": 4}


@register_task
class SRx2(SuperResolution):
    name = "sr_x2"
    scale = 2
    model_kwargs: dict[str, Any] = {"scale": 2}
