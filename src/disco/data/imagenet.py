"""Photos for an ImageNet-pretrained 1000-way classifier: the two evaluation sets and the calibration pool.

Everything is read from ``../shared/data`` (or another root), decoded once into uint8 tensors
(N x 3 x 224 x 224) and cached as ``.npy`` in the cache folder (``$DISCO_CACHE`` or ``~/.cache/disco``).

- **Evaluation** (never used to fit anything):
  ``inette``: the 2000 val photos of ``imagenette224`` (``val.tar`` + ``val_extra.tar``), each labelled with
  its class's ImageNet-1k index; ``sample1000``: ``imagenet_sample1000``, one photo per ImageNet-1k class.
- **Pool** (calibration, reconstruction, distillation; unlabelled): ``imagenette224``'s 3000 train photos
  and every other photo of the shared folder that is not an evaluation photo: COCO128, BSD100, T91,
  Set14 and the CamVid frames. Each photo is resized (short side 224, bicubic) and centre-cropped to 224.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import RefusedError
from .imagefolder import cache_dir

log = logging.getLogger(__name__)

SIZE = 224
# imagenette224/README.md: each class's wnid and ILSVRC-2012 index (sorted wnid order)
IMAGENETTE_INDEX = {
    "n01440764": 0, "n02102040": 217, "n02979186": 482, "n03000684": 491, "n03028079": 497,
    "n03394916": 566, "n03417042": 569, "n03425413": 571, "n03445777": 574, "n03888257": 701,
}
IMAGENETTE_CLASSES = tuple(sorted(IMAGENETTE_INDEX.values()))
EVAL_SETS = ("inette", "sample1000")
# (source name, folder under the data root, glob patterns): the unlabelled photos of the pool besides Imagenette
OTHER_SOURCES = (
    ("coco128", "coco128/images", ("**/*.jpg",)),
    ("bsd100", "bsd100/HR", ("*.png",)),
    ("t91", "t91/HR", ("*.png", "*.bmp")),
    ("set14", "set14/HR", ("*.png",)),
    ("camvid", "camvid/CamVid", ("train/*.png", "val/*.png", "test/*.png")),
)


def _to_224(data: bytes) -> np.ndarray:
    """Decode a photo, resize its short side to 224 (bicubic) and centre-crop 224 x 224: uint8 [3, 224, 224]."""
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img = img.convert("RGB")
    w, h = img.size
    if (w, h) != (SIZE, SIZE):
        s = SIZE / min(w, h)
        img = img.resize((max(SIZE, round(w * s)), max(SIZE, round(h * s))), Image.BICUBIC)
        w, h = img.size
        left, top = (w - SIZE) // 2, (h - SIZE) // 2
        img = img.crop((left, top, left + SIZE, top + SIZE))
    return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1).copy()


def _tar_members(tar: Path) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(tar) as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            if m.isfile() and m.name.lower().endswith((".jpeg", ".jpg", ".png")):
                f = tf.extractfile(m)
                if f is not None:
                    yield m.name, f.read()


@dataclass
class Photos:
    """Decoded photos: ``images`` uint8 [N, 3, 224, 224], ``labels`` (ImageNet-1k index, -1 when unlabelled)
    and ``source`` (the data set each photo comes from)."""

    images: Tensor
    labels: Tensor
    source: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx: np.ndarray | list[int]) -> Photos:
        idx = list(map(int, idx))
        return Photos(self.images[idx], self.labels[idx], [self.source[i] for i in idx])


def _cached(key: str, build: Callable[[], tuple[np.ndarray, np.ndarray, list[str]]]) -> Photos:
    d = cache_dir() / "imagenet-photos"
    d.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha1(key.encode()).hexdigest()[:16]
    f = d / f"{h}.npz"
    if f.is_file():
        z = np.load(f, allow_pickle=False)
        return Photos(torch.from_numpy(z["images"]), torch.from_numpy(z["labels"]), list(z["source"]))
    log.info("decoding photos (%s) into %s", key[:80], f)
    imgs, labels, source = build()
    tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp.npz")  # two runs may decode the same set at once
    np.savez(tmp, images=imgs, labels=labels, source=np.array(source))
    tmp.replace(f)
    return Photos(torch.from_numpy(imgs), torch.from_numpy(labels), source)


def _key(*paths: Path) -> str:
    parts = []
    for p in paths:
        st = p.stat()
        parts.append(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _need(root: Path, rel: str) -> Path:
    p = root / rel
    if not p.exists():
        raise RefusedError(f"{p} does not exist: the ImageNet photos need ../shared/data (or --data DIR) with {rel}")
    return p


def load_eval(root: str | Path, name: str) -> Photos:
    """One evaluation set: ``inette`` (2000 photos, 10 classes) or ``sample1000`` (1000 photos, 1000 classes)."""
    root = Path(root)
    if name == "inette":
        tars = [_need(root, "imagenette224/val.tar"), _need(root, "imagenette224/val_extra.tar")]

        def build() -> tuple[np.ndarray, np.ndarray, list[str]]:
            imgs, labels = [], []
            for tar in tars:
                for member, data in _tar_members(tar):
                    wnid = member.split("/")[1]
                    if wnid not in IMAGENETTE_INDEX:
                        raise RefusedError(f"{tar}: member {member} is of no Imagenette class")
                    imgs.append(_to_224(data))
                    labels.append(IMAGENETTE_INDEX[wnid])
            return np.stack(imgs), np.array(labels, dtype=np.int64), ["inette"] * len(labels)

        return _cached("eval:inette:" + _key(*tars), build)
    if name == "sample1000":
        tar, tsv = _need(root, "imagenet_sample1000/val.tar"), _need(root, "imagenet_sample1000/classes.tsv")

        def build() -> tuple[np.ndarray, np.ndarray, list[str]]:
            index = {}
            for line in tsv.read_text().splitlines():
                cols = line.split("\t")
                if len(cols) >= 2 and cols[0].isdigit():
                    index[cols[1]] = int(cols[0])
            imgs, labels = [], []
            for member, data in _tar_members(tar):
                imgs.append(_to_224(data))
                labels.append(index[member.split("/")[1]])
            return np.stack(imgs), np.array(labels, dtype=np.int64), ["sample1000"] * len(labels)

        return _cached("eval:sample1000:" + _key(tar, tsv), build)
    raise ValueError(f"unknown evaluation set {name!r}: one of {', '.join(EVAL_SETS)}")


def load_pool(root: str | Path) -> Photos:
    """The unlabelled pool: Imagenette's 3000 train photos and every other non-evaluation photo (see module doc)."""
    root = Path(root)
    tars = [_need(root, "imagenette224/train.tar"), _need(root, "imagenette224/train_extra.tar")]
    files: list[tuple[str, Path]] = []
    for name, folder, patterns in OTHER_SOURCES:
        d = root / folder
        if not d.is_dir():
            log.warning("pool: %s is absent, the pool goes without %s", d, name)
            continue
        files += [(name, p) for pat in patterns for p in sorted(d.glob(pat))]

    def build() -> tuple[np.ndarray, np.ndarray, list[str]]:
        imgs, source = [], []
        for tar in tars:
            for _, data in _tar_members(tar):
                imgs.append(_to_224(data))
                source.append("inette_train")
        for name, p in files:
            imgs.append(_to_224(p.read_bytes()))
            source.append(name)
        return np.stack(imgs), np.full(len(imgs), -1, dtype=np.int64), source

    return _cached("pool:" + _key(*tars) + "|" + ",".join(f"{n}:{p.resolve()}" for n, p in files), build)


def draw_mixed(photos: Photos, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of ``n`` photos drawn without replacement, half Imagenette train, half the other sources."""
    src = np.array(photos.source)
    inette, other = np.flatnonzero(src == "inette_train"), np.flatnonzero(src != "inette_train")
    return np.sort(np.concatenate([rng.choice(inette, n // 2, replace=False),
                                   rng.choice(other, min(n - n // 2, len(other)), replace=False)]))


def split_pool(pool: Photos, guard: int = 200, seed: int = 0) -> tuple[Photos, Photos]:
    """(fit, guard): a held-out guard set of ``guard`` photos (:func:`draw_mixed`, a fixed seed); the rest is the
    fitting pool."""
    held = draw_mixed(pool, guard, np.random.default_rng(seed))
    rest = np.setdiff1d(np.arange(len(pool)), held)
    return pool.subset(rest), pool.subset(held)


def normalize(x: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """uint8 (or float in 0..255) images -> the network's input: (x / 255 - mean) / std."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return (x.float() / 255.0 - m) / s
