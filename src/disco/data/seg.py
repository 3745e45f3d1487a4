"""Semantic segmentation data: CamVid (SegNet's 480x360, 11 classes) and Cityscapes-style folders.

Conventions (the same for every layout):

- Images are RGB uint8; labels are class indices (uint8). Every label value that is not a
  class (``>= num_classes``: CamVid's void 11, Cityscapes' 255) becomes :data:`IGNORE` (255).
- The model sees images at ``base_scale`` of their size (CamVid: 0.5, i.e. 240x180), normalised
  with the ImageNet mean and standard deviation. Training crops come from images rescaled by
  ``base_scale * U(scale_range)`` (bilinear with antialiasing; labels nearest), padded where
  smaller than the crop (label :data:`IGNORE`), cropped at random and flipped left-right
  with probability 1/2.
- Evaluation keeps the labels at full resolution: the task upsamples the logits to them.

Everything is decoded once into memory (uint8), so training needs no ``DataLoader`` workers.

Layouts of ``--data`` (see :func:`find_layout`)::

    DATA/CamVid/{train,val,test}/X.png + DATA/CamVid/{train,val,test}annot/X.png   (SegNet's CamVid,
        the 1/3 subset in ../shared/data/camvid or the full 367/101/233 images; DATA may be CamVid/ itself)
    DATA/leftImg8bit/{train,val}/CITY/X_leftImg8bit.png +
    DATA/gtFine/{train,val}/CITY/X_gtFine_labelTrainIds.png                            (Cityscapes)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

IGNORE = 255
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CAMVID_SPLITS = ("train", "val", "test")


@dataclass
class Layout:
    """A dataset folder: its kind (``"camvid"`` or ``"cityscapes"``) and its root."""

    kind: str
    root: Path


def find_layout(data: str | Path) -> Layout:
    """Recognise a CamVid (SegNet) or Cityscapes folder; a clear error for anything else."""
    data = Path(data)
    if not data.is_dir():
        raise FileNotFoundError(f"segmentation data folder {data} does not exist")
    if (data / "leftImg8bit").is_dir() and (data / "gtFine").is_dir():
        return Layout("cityscapes", data)
    for root in (data, data / "CamVid", data / "camvid" / "CamVid", data / "camvid"):
        if (root / "train").is_dir() and (root / "trainannot").is_dir():
            return Layout("camvid", root)
    raise FileNotFoundError(f"{data} is neither a CamVid folder (CamVid/train + CamVid/trainannot) nor a "
                            "Cityscapes folder (leftImg8bit/ + gtFine/)")


def split_pairs(layout: Layout, split: str) -> list[tuple[Path, Path]]:
    """Sorted (image, label) file pairs of a split; every image must have its label."""
    pairs = []
    if layout.kind == "camvid":
        folder = layout.root / split
        images = sorted(folder.glob("*.png")) if folder.is_dir() else []
        for p in images:
            pairs.append((p, layout.root / f"{split}annot" / p.name))
    else:
        folder = layout.root / "leftImg8bit" / split
        images = sorted(folder.glob("*/*_leftImg8bit.png")) if folder.is_dir() else []
        for p in images:
            stem = p.name.removesuffix("_leftImg8bit.png")
            pairs.append((p, layout.root / "gtFine" / split / p.parent.name / f"{stem}_gtFine_labelTrainIds.png"))
    if not pairs:
        raise FileNotFoundError(f"{layout.kind} split {split!r} has no images under {folder}")
    missing = [str(lab) for _, lab in pairs if not lab.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} label file(s) missing, e.g. {missing[0]}")
    return pairs


def read_pair(image: Path, label: Path, num_classes: int) -> tuple[Tensor, Tensor]:
    """uint8 image [3,H,W] and uint8 label [H,W] with non-class values set to :data:`IGNORE`."""
    from PIL import Image

    with Image.open(image) as im:
        img = torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()
    with Image.open(label) as im:
        if im.mode not in ("L", "P", "I", "I;16"):
            raise ValueError(f"{label}: label maps must hold class indices (mode L), got mode {im.mode}")
        lab = np.asarray(im, dtype=np.int64)
    if lab.shape != tuple(img.shape[1:]):
        raise ValueError(f"{label}: label {lab.shape} and image {tuple(img.shape[1:])} differ in size")
    lab = np.where((lab >= 0) & (lab < num_classes), lab, IGNORE).astype(np.uint8)
    return img, torch.from_numpy(lab)


def resize(img: Tensor, label: Tensor | None, size: tuple[int, int]) -> tuple[Tensor, Tensor | None]:
    """uint8 image [3,H,W] (bilinear, antialiased) and label [H,W] (nearest) resized to ``size`` (h, w)."""
    if tuple(img.shape[-2:]) == tuple(size):
        return img, label
    x = F.interpolate(img[None].float(), size=size, mode="bilinear", antialias=True, align_corners=False)
    out = x[0].round().clamp(0, 255).to(torch.uint8)
    if label is not None:
        label = F.interpolate(label[None, None].float(), size=size, mode="nearest-exact")[0, 0].to(torch.uint8)
    return out, label


def scaled_size(shape: tuple[int, ...], scale: float) -> tuple[int, int]:
    return max(1, round(shape[-2] * scale)), max(1, round(shape[-1] * scale))


def normalize(img: Tensor) -> Tensor:
    """uint8 [B,3,H,W] or [3,H,W] -> float, ImageNet mean/std (a batch dim is added)."""
    x = img.float().div(255)
    x = x if x.ndim == 4 else x[None]
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def load_split(data: str | Path, split: str, num_classes: int, scale: float = 1.0, keep_labels: bool = False,
               limit: int | None = None) -> list[tuple[str, Tensor, Tensor]]:
    """``(name, image, label)`` of a split, images resized by ``scale``; labels too unless ``keep_labels``."""
    from tqdm import tqdm

    pairs = split_pairs(find_layout(data), split)[:limit]
    out = []
    for ip, lp in tqdm(pairs, desc=f"reading {split}", unit="img", leave=False):
        img, lab = read_pair(ip, lp, num_classes)
        size = scaled_size(tuple(img.shape), scale)
        img, small = resize(img, None if keep_labels else lab, size)
        out.append((ip.stem, img, lab if keep_labels else small))
    return out


class SegTrainLoader:
    """Random-scale crops with flips. One epoch draws every image once (a random order) in
    ``len()`` batches of ``batch_size`` (the last partial batch is dropped; with fewer images
    than a batch, images repeat). Images are decoded on first use, at the largest scale needed."""

    def __init__(self, data: str | Path, num_classes: int, split: str = "train", batch_size: int = 8,
                 crop: tuple[int, int] = (176, 224), base_scale: float = 0.5,
                 scale_range: tuple[float, float] = (0.75, 1.5), limit: int | None = None, seed: int = 0) -> None:
        self.data, self.num_classes, self.split, self.limit = data, num_classes, split, limit
        self.batch_size, self.crop, self.base_scale, self.scale_range = batch_size, tuple(crop), base_scale, scale_range
        self.store_scale = min(1.0, base_scale * scale_range[1])
        self.gen = torch.Generator().manual_seed(seed)
        self._samples: list[tuple[str, Tensor, Tensor]] | None = None
        self._n = len(split_pairs(find_layout(data), split)[:limit])

    @property
    def samples(self) -> list[tuple[str, Tensor, Tensor]]:
        if self._samples is None:
            self._samples = load_split(self.data, self.split, self.num_classes, self.store_scale, limit=self.limit)
        return self._samples

    def __len__(self) -> int:
        return max(1, self._n // self.batch_size)

    def sample(self, i: int) -> tuple[Tensor, Tensor]:
        """One augmented crop of image ``i``: uint8 image [3,h,w], int64 label [h,w]."""
        _, img, lab = self.samples[i]
        g, (ch, cw) = self.gen, self.crop
        lo, hi = self.scale_range
        s = self.base_scale * (lo + (hi - lo) * float(torch.rand((), generator=g))) / self.store_scale
        img, lab = resize(img, lab, scaled_size(tuple(img.shape), s))
        ph, pw = max(0, ch - img.shape[1]), max(0, cw - img.shape[2])
        if ph or pw:  # pad bottom/right: image with the mean colour (0 after normalising), label ignored
            mean = torch.tensor(MEAN).mul(255).round().to(torch.uint8).view(3, 1, 1)
            canvas = mean.expand(3, img.shape[1] + ph, img.shape[2] + pw).clone()
            canvas[:, :img.shape[1], :img.shape[2]] = img
            lab = F.pad(lab, (0, pw, 0, ph), value=IGNORE)
            img = canvas
        y = int(torch.randint(0, img.shape[1] - ch + 1, (1,), generator=g))
        x = int(torch.randint(0, img.shape[2] - cw + 1, (1,), generator=g))
        img, lab = img[:, y:y + ch, x:x + cw], lab[y:y + ch, x:x + cw]
        if torch.rand((), generator=g) < 0.5:
            img, lab = img.flip(2), lab.flip(1)
        return img, lab.long()

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        n, bs = len(self.samples), self.batch_size
        need = len(self) * bs
        order = torch.cat([torch.randperm(n, generator=self.gen) for _ in range(math.ceil(need / n))])[:need]
        for k in range(len(self)):
            imgs, labs = zip(*(self.sample(i) for i in order[k * bs:(k + 1) * bs].tolist()), strict=True)
            yield normalize(torch.stack(imgs)), torch.stack(labs)


class SegEvalSet:
    """An evaluation split: images at ``base_scale`` (the model's input), labels at full resolution.

    Iterating yields ``(x, y)``: normalised float images [B,3,h,w] and int64 labels [B,H,W]
    (:data:`IGNORE` where void), consecutive images of one size batched up to ``batch_size``.
    """

    def __init__(self, data: str | Path, num_classes: int, split: str = "test", base_scale: float = 0.5,
                 batch_size: int = 8, limit: int | None = None) -> None:
        self.batch_size = batch_size
        self.samples = load_split(data, split, num_classes, base_scale, keep_labels=True, limit=limit)

    def batches(self) -> list[list[int]]:
        out: list[list[int]] = []
        for i, (_, img, lab) in enumerate(self.samples):
            prev = self.samples[out[-1][0]] if out else None
            if (prev is not None and len(out[-1]) < self.batch_size and prev[1].shape == img.shape
                    and prev[2].shape == lab.shape):
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for idx in self.batches():
            yield (normalize(torch.stack([self.samples[i][1] for i in idx])),
                   torch.stack([self.samples[i][2] for i in idx]).long())
