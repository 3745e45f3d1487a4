"""Super-resolution data: folders of HR images, LR made in code by bicubic downsampling.

Conventions (the same for training and evaluation):

- An HR image is RGB uint8 (grayscale and palette images are converted to RGB), cropped
  to a multiple of the scale ("modcrop": the bottom/right rows and columns are dropped).
- The LR image is ``torch.nn.functional.interpolate(hr, size=(H/s, W/s), mode="bicubic",
  antialias=True)`` of the whole modcropped HR image (PIL's antialiased bicubic, a = -0.5,
  close to MATLAB's ``imresize``), clamped to [0, 1] and rounded to 8 bits, as if it had
  been saved as a PNG. Training pairs are crops of (LR, HR) at aligned positions, so the
  LR of a patch is exactly the LR image there (no border effect of downsampling a crop).
- Tensors are float in [0, 1], NCHW.

Everything is decoded once into memory (uint8), so training needs no ``DataLoader`` workers:
on 2 CPU cores a batch of 16 patches is cut and augmented in well under a millisecond.

Folder layout of ``--data`` (see :func:`sr_folders`)::

    DATA/t91/HR/*.bmp      training images (or DATA/train/, e.g. a link to DIV2K_train_HR)
    DATA/set5/HR/*.png     evaluation sets: set5, set14, bsd100 (those present are used)
    DATA/set14/HR/*.png
    DATA/bsd100/HR/*.png
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

IMAGE_EXTS = (".png", ".bmp", ".jpg", ".jpeg", ".tif", ".tiff", ".webp")
EVAL_SETS = ("set5", "set14", "bsd100")
TRAIN_FOLDERS = ("train", "t91")


def image_files(folder: str | Path) -> list[Path]:
    """Sorted image files of ``folder`` (or of ``folder/HR`` when that exists)."""
    folder = Path(folder)
    if (folder / "HR").is_dir():
        folder = folder / "HR"
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS and p.is_file())
    if not files:
        raise FileNotFoundError(f"{folder} holds no images ({', '.join(IMAGE_EXTS)})")
    return files


def read_rgb(path: str | Path) -> Tensor:
    """One image as a uint8 RGB tensor [3, H, W] (grayscale becomes R = G = B)."""
    from PIL import Image

    with Image.open(path) as im:
        arr = np.asarray(im.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def modcrop(img: Tensor, scale: int) -> Tensor:
    """Crop the last two dims to multiples of ``scale`` (top-left kept)."""
    h, w = img.shape[-2:]
    return img[..., : h - h % scale, : w - w % scale]


def quantize(x: Tensor) -> Tensor:
    """Clamp to [0, 1] and round to 8-bit levels (what saving as PNG does)."""
    return x.clamp(0, 1).mul(255).round().div(255)


def to_float(x: Tensor) -> Tensor:
    """uint8 -> float in [0, 1] (a batch dim is added to a single CHW image)."""
    x = x.float().div(255)
    return x if x.ndim == 4 else x.unsqueeze(0)


def bicubic_down(hr: Tensor, scale: int) -> Tensor:
    """LR of a float NCHW HR batch (H, W multiples of ``scale``): antialiased bicubic, 8-bit."""
    h, w = hr.shape[-2:]
    if h % scale or w % scale:
        raise ValueError(f"HR size {h}x{w} is not a multiple of the scale {scale}: modcrop first")
    lr = F.interpolate(hr, size=(h // scale, w // scale), mode="bicubic", antialias=True, align_corners=False)
    return quantize(lr)


def bicubic_up(lr: Tensor, scale: int) -> Tensor:
    """The bicubic baseline: float NCHW LR upsampled by ``scale``, 8-bit.

    ``antialias=True`` selects PIL's cubic kernel (a = -0.5, MATLAB's ``imresize`` too); with it
    Set5/Set14/BSD100 x4 give 28.43/26.09/25.96 dB, against the published 28.42/26.00/25.96.
    """
    h, w = lr.shape[-2:]
    return quantize(F.interpolate(lr, size=(h * scale, w * scale), mode="bicubic", antialias=True,
                                  align_corners=False))


def load_pairs(folder: str | Path, scale: int, limit: int | None = None) -> list[tuple[str, Tensor, Tensor]]:
    """``(name, lr uint8 [3,h,w], hr uint8 [3,h*s,w*s])`` for the (first ``limit``) images of a folder."""
    from tqdm import tqdm

    files = image_files(folder)[:limit]
    out = []
    for p in tqdm(files, desc=f"reading {Path(folder).name}", unit="img", leave=False):
        hr = modcrop(read_rgb(p), scale)
        lr = bicubic_down(to_float(hr), scale)[0].mul(255).round().to(torch.uint8)
        out.append((p.stem, lr, hr))
    return out


def sr_folders(data: str | Path) -> tuple[Path, dict[str, Path]]:
    """Resolve ``--data``: the training folder and the evaluation sets present.

    ``data`` holds ``train/`` (any HR image folder, e.g. a link to DIV2K) or ``t91/``, and
    ``set5/``, ``set14/``, ``bsd100/`` (each with its images directly or under ``HR/``).
    A ``data`` that is itself a folder of images is a training folder with no evaluation sets.
    """
    root = Path(data)
    if not root.is_dir():
        raise FileNotFoundError(f"SR data folder {root} does not exist")
    train = next((root / n for n in TRAIN_FOLDERS if (root / n).is_dir()), None)
    evals = {n: root / n for n in EVAL_SETS if (root / n).is_dir()}
    if train is None:
        try:
            image_files(root)
            train = root
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{root} holds neither train/ nor t91/ nor images: no SR training set") from e
    return train, evals


class SRTrainLoader:
    """Random aligned (LR, HR) patches with flips and 90-degree rotations.

    ``patch`` is the LR patch size (HR patches are ``patch * scale``). Images smaller than
    one HR patch are skipped. Each image is drawn with probability proportional to the
    number of patch positions it holds, so every pixel is about equally likely. One epoch is
    as many patches as cover the training set's HR area once, ``len()`` batches of
    ``batch_size``.
    """

    def __init__(self, folder: str | Path, scale: int = 4, patch: int = 24, batch_size: int = 16,
                 limit: int | None = None, seed: int = 0) -> None:
        self.scale, self.patch, self.batch_size = scale, patch, batch_size
        hp = patch * scale
        pairs = load_pairs(folder, scale, limit)
        self.pairs = [(lr, hr) for _, lr, hr in pairs if min(hr.shape[-2:]) >= hp]
        if len(self.pairs) < len(pairs):
            log.info("%s: skipped %d image(s) smaller than the %dx%d HR patch", folder,
                     len(pairs) - len(self.pairs), hp, hp)
        if not self.pairs:
            raise ValueError(f"{folder}: no image is at least {hp}x{hp} pixels (the HR patch)")
        positions = np.array([(lr.shape[1] - patch + 1) * (lr.shape[2] - patch + 1) for lr, _ in self.pairs],
                             dtype=np.float64)
        self.weights = torch.from_numpy(positions / positions.sum())
        area = sum(hr.shape[1] * hr.shape[2] for _, hr in self.pairs)
        self.patches_per_epoch = max(1, round(area / (hp * hp)))
        self.gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return math.ceil(self.patches_per_epoch / self.batch_size)

    def sample(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` random augmented pairs as float batches (lr [n,3,p,p], hr [n,3,p*s,p*s])."""
        p, s, g = self.patch, self.scale, self.gen
        idx = torch.multinomial(self.weights, n, replacement=True, generator=g)
        aug = torch.randint(0, 8, (n,), generator=g)  # bit 0: h-flip, bit 1: v-flip, bit 2: transpose
        lrs, hrs = [], []
        for i, a in zip(idx.tolist(), aug.tolist(), strict=True):
            lr, hr = self.pairs[i]
            y = int(torch.randint(0, lr.shape[1] - p + 1, (1,), generator=g))
            x = int(torch.randint(0, lr.shape[2] - p + 1, (1,), generator=g))
            lp = lr[:, y:y + p, x:x + p]
            hq = hr[:, y * s:(y + p) * s, x * s:(x + p) * s]
            if a & 1:
                lp, hq = lp.flip(2), hq.flip(2)
            if a & 2:
                lp, hq = lp.flip(1), hq.flip(1)
            if a & 4:
                lp, hq = lp.transpose(1, 2), hq.transpose(1, 2)
            lrs.append(lp)
            hrs.append(hq)
        return torch.stack(lrs).float().div_(255), torch.stack(hrs).float().div_(255)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        left = self.patches_per_epoch
        while left > 0:
            n = min(self.batch_size, left)
            left -= n
            yield self.sample(n)


class SREvalSets:
    """The evaluation sets, decoded once: ``sets[name]`` is a list of ``(image, lr, hr)`` (uint8).

    Iterating yields ``(lr, hr)`` float pairs of single images (batch 1, sizes differ).
    """

    def __init__(self, folders: dict[str, Path], scale: int = 4, limit: int | None = None) -> None:
        self.scale = scale
        self.sets = {name: load_pairs(folder, scale, limit) for name, folder in folders.items()}
        self.cache: dict[str, float] = {}  # metrics that do not depend on the model (the bicubic baseline)

    def __len__(self) -> int:
        return sum(len(v) for v in self.sets.values())

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for pairs in self.sets.values():
            for _, lr, hr in pairs:
                yield to_float(lr), to_float(hr)
