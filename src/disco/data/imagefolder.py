"""Image classification data in torchvision's ``ImageFolder`` layout (``DIR/train/<class>/*``, ``DIR/val/<class>/*``).

``DIR`` may instead hold ``train.tar`` and ``val.tar`` with the same layout inside (the shared
imagenette224 copy): they are unpacked once into the cache (``$DISCO_CACHE`` or
``~/.cache/disco``, or ``cache_dir``), never next to the data.

Bad input:

- no ``train``/``val`` folder, a split without class subfolders, a class folder without any image
  (by extension): :class:`~disco.errors.RefusedError` naming the folder;
- files without an image extension are ignored (as ``ImageFolder`` does);
- an image file that cannot be decoded is *skipped*: the next readable image of the split takes its
  place in the batch (so every batch, and every rank under torchrun, keeps its size) and the loader
  logs one warning per epoch with the count and the first file names. A split where nothing decodes
  is an error;
- grayscale, palette, CMYK and RGBA images are converted to RGB.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import RefusedError

log = logging.getLogger(__name__)

MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics (what torchvision and timm weights expect)
STD = (0.229, 0.224, 0.225)
SPLITS = ("train", "val")


def cache_dir(override: str | Path | None = None) -> Path:
    d = Path(override) if override else Path(os.environ.get("DISCO_CACHE", Path.home() / ".cache" / "disco"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _unpack(tar: Path, cache: Path | None) -> Path:
    """Unpack ``tar`` once into the cache; return the folder holding its top-level entries."""
    st = tar.stat()
    key = hashlib.sha1(f"{tar.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = cache_dir(cache) / f"imagefolder-{tar.stem}-{key}"
    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("unpacking %s into %s", tar, dest)
    try:
        with tarfile.open(tar, "r") as tf:
            tf.extractall(tmp, filter="data")
    except (tarfile.TarError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RefusedError(f"{tar}: cannot unpack ({e})") from e
    try:
        tmp.rename(dest)
    except OSError:  # another process (another rank) got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def split_dir(root: str | Path, split: str, cache: str | Path | None = None) -> Path:
    """The folder of ``split`` (``train`` or ``val``) under ``root``, unpacking ``root/split.tar`` if needed."""
    root = Path(root)
    if not root.is_dir():
        raise RefusedError(f"data folder {root} does not exist")
    d = root / split
    if d.is_dir():
        return d
    tar = root / f"{split}.tar"
    if tar.is_file():
        unpacked = _unpack(tar, cache)
        if (unpacked / split).is_dir():
            return unpacked / split
        return unpacked
    raise RefusedError(f"{root} has no {split}/ folder (DIR/{split}/<class>/<image>) and no {split}.tar")


def find_classes(folder: Path) -> list[str]:
    """Class names (sorted subfolder names) of one split; refuses an empty split or an empty class."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise RefusedError(f"{folder} has no class subfolders: expected {folder}/<class>/<image>")
    for c in classes:
        if not any(f.lower().endswith(IMG_EXTENSIONS) for _, _, fs in os.walk(folder / c) for f in fs):
            raise RefusedError(f"class folder {folder / c} holds no image (extensions {', '.join(IMG_EXTENSIONS)})")
    return classes


def _open_rgb(path: str) -> Any:
    from PIL import Image

    with open(path, "rb") as f:
        img = Image.open(f)
        img.load()
    if img.mode != "RGB":  # L, P, CMYK, RGBA, I;16 ...
        img = img.convert("RGB")
    return img


class SkippingImageFolder(torch.utils.data.Dataset):
    """``ImageFolder`` whose unreadable images are replaced by the next readable one (see the module doc)."""

    def __init__(self, folder: Path, classes: list[str], transform: Any) -> None:
        from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

        self.folder, self.classes, self.transform = folder, classes, transform
        self.samples = make_dataset(str(folder), {c: i for i, c in enumerate(classes)}, IMG_EXTENSIONS)
        self.targets = [t for _, t in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, int, list[str]]:
        bad: list[str] = []
        for k in range(len(self.samples)):
            path, target = self.samples[(i + k) % len(self.samples)]
            try:
                img = _open_rgb(path)
            except Exception:  # PIL raises many types for a damaged file
                bad.append(path)
                continue
            return self.transform(img), target, bad
        raise RefusedError(f"{self.folder}: no image of this split could be decoded")


def _collate(batch: list[tuple[Tensor, int, list[str]]]) -> tuple[Tensor, Tensor, list[str]]:
    xs, ys, bad = zip(*batch, strict=True)
    return torch.stack(xs), torch.tensor(ys), [p for b in bad for p in b]


def transforms(image_size: int, train: bool) -> Any:
    """torchvision's standard classification transforms at ``image_size``."""
    from torchvision import transforms as T

    norm = [T.ToTensor(), T.Normalize(MEAN, STD)]
    if train:
        return T.Compose([T.RandomResizedCrop(image_size, antialias=True), T.RandomHorizontalFlip(), *norm])
    return T.Compose([T.Resize(round(image_size / 0.875), antialias=True), T.CenterCrop(image_size), *norm])


class _ShardSampler(torch.utils.data.Sampler):
    """Sample ``rank::world`` of ``indices`` in order: evaluation shards without the padding of
    ``DistributedSampler`` (padding would count some images twice)."""

    def __init__(self, indices: list[int], rank: int, world: int) -> None:
        self.indices = indices[rank::world]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ImageFolderLoader:
    """Batches ``(images, labels)`` of one split; iterating logs the skipped (undecodable) files.

    Under torch.distributed the training split uses a ``DistributedSampler`` (``set_epoch`` is
    called by the training loop) and the evaluation split a strided shard of each rank.
    """

    def __init__(self, dataset: SkippingImageFolder, batch_size: int, train: bool, workers: int,
                 indices: list[int], seed: int = 0, rank: int = 0, world: int = 1) -> None:
        self.dataset, self.train = dataset, train
        sub = torch.utils.data.Subset(dataset, indices)
        if train:
            self.sampler: Any = torch.utils.data.DistributedSampler(sub, num_replicas=world, rank=rank,
                                                                    shuffle=True, seed=seed, drop_last=False)
            data: Any = sub
        else:
            self.sampler = _ShardSampler(list(range(len(indices))), rank, world)
            data = sub
        self.loader = torch.utils.data.DataLoader(
            data, batch_size=batch_size, sampler=self.sampler, num_workers=workers, collate_fn=_collate,
            persistent_workers=workers > 0, pin_memory=torch.cuda.is_available(), drop_last=False)
        self.skipped: set[str] = set()

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        bad: list[str] = []
        for x, y, b in self.loader:
            bad.extend(b)
            yield x, y
        if bad:
            new = sorted(set(bad) - self.skipped)
            self.skipped.update(bad)
            log.warning("%s: skipped %d unreadable image(s) this pass (replaced by the next readable one): %s%s",
                        self.dataset.folder, len(bad), ", ".join(new[:3] or sorted(set(bad))[:3]),
                        " ..." if len(set(bad)) > 3 else "")


def subset_indices(targets: list[int], limit: int | None) -> list[int]:
    """All indices, or a deterministic class-mixed subset of ``limit`` of them."""
    n = len(targets)
    if limit is None or limit >= n:
        return list(range(n))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1234))[:limit]
    return sorted(perm.tolist())
