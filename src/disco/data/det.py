"""Object detection data in COCO format: loading, batching, and a generated set from real images.

A *COCO folder* is one of

* a standard COCO 2017 folder: ``train2017/``, ``val2017/``, ``annotations/instances_{train,val}2017.json``;
* coco128 (``images/train2017/`` + ``annotations/instances_train2017.json``): train and test are
  the same 128 images, the customary use of that set;
* the generated set written by :func:`make_generated`: ``train/``, ``test/``,
  ``annotations/instances_{train,test}.json``.

Images are resized (without keeping the aspect ratio, as SSD does) to ``size x size`` and
normalised; training targets are boxes in input pixels (x1, y1, x2, y2) and contiguous labels
1..K (0 is the background); evaluation targets also carry the original annotations (crowd
flags, areas, original pixel boxes) so that the metric can be computed from the batches alone.

The generated set pastes CIFAR-10 images (the objects, 10 classes) at random scales and positions
on Imagenette backgrounds: train images from the train splits, test images from the test splits;
it is deterministic (seeded) and written once into the cache (``$DISCO_CACHE``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .cifar import CLASSES as CIFAR_CLASSES
from .cifar import _cache_dir, load_cifar10

log = logging.getLogger(__name__)

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

# (image folder, annotation file) candidates per split, relative to the COCO folder
_LAYOUTS = {
    "train": [("train", "annotations/instances_train.json"), ("train2017", "annotations/instances_train2017.json"),
              ("images/train2017", "annotations/instances_train2017.json")],
    "test": [("test", "annotations/instances_test.json"), ("val2017", "annotations/instances_val2017.json"),
             ("images/val2017", "annotations/instances_val2017.json"),
             ("images/train2017", "annotations/instances_train2017.json")],  # coco128: train = test
}


def coco_split(folder: str | Path, split: str) -> tuple[Path, Path]:
    """(image folder, annotation file) of ``split`` ('train' or 'test') in a COCO folder."""
    folder = Path(folder)
    for img, ann in _LAYOUTS[split]:
        if (folder / img).is_dir() and (folder / ann).is_file():
            if img == "images/train2017" and split == "test":
                log.info("%s has no held-out split: evaluating on the training images (coco128's usual use)", folder)
            return folder / img, folder / ann
    raise FileNotFoundError(f"{folder} holds no COCO {split} split: expected one of "
                            + ", ".join(f"{i}/ + {a}" for i, a in _LAYOUTS[split]))


class CocoDet:
    """One COCO split resized to ``size``: uint8 images [N,3,S,S] (decoded lazily), targets per image."""

    def __init__(self, folder: str | Path, split: str, size: int, limit: int | None = None) -> None:
        from pycocotools.coco import COCO

        img_dir, ann = coco_split(folder, split)
        import contextlib

        with contextlib.redirect_stdout(io.StringIO()):
            self.coco = COCO(str(ann))
        self.img_dir, self.size = img_dir, size
        self.cat_ids = sorted(self.coco.getCatIds())
        self.label_of = {c: k + 1 for k, c in enumerate(self.cat_ids)}  # 0 is the background
        self.names = [self.coco.cats[c]["name"] for c in self.cat_ids]
        ids = sorted(self.coco.getImgIds())
        self.ids = ids if limit is None else ids[:limit]
        self._cache: dict[int, Tensor] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def image(self, k: int) -> Tensor:
        """Image ``k`` as uint8 [3, S, S] (kept in memory after the first read)."""
        if k not in self._cache:
            from PIL import Image

            info = self.coco.imgs[self.ids[k]]
            img = Image.open(self.img_dir / info["file_name"]).convert("RGB").resize((self.size, self.size),
                                                                                   Image.BILINEAR)
            self._cache[k] = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
        return self._cache[k]

    def target(self, k: int) -> dict[str, Tensor]:
        """Training boxes (input pixels, crowd removed) and labels, plus the original annotations."""
        iid = self.ids[k]
        info = self.coco.imgs[iid]
        h, w = info["height"], info["width"]
        anns = self.coco.loadAnns(self.coco.getAnnIds(imgIds=[iid]))
        gt = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        crowd = torch.tensor([int(a.get("iscrowd", 0)) for a in anns], dtype=torch.int64)
        labels = torch.tensor([self.label_of[a["category_id"]] for a in anns], dtype=torch.int64)
        area = torch.tensor([float(a.get("area", a["bbox"][2] * a["bbox"][3])) for a in anns], dtype=torch.float32)
        sx, sy = self.size / w, self.size / h
        boxes = torch.stack([gt[:, 0] * sx, gt[:, 1] * sy, (gt[:, 0] + gt[:, 2]) * sx, (gt[:, 1] + gt[:, 3]) * sy], 1)
        ok = (crowd == 0) & (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
        return {"boxes": boxes[ok], "labels": labels[ok], "image_id": torch.tensor(iid),
                "orig_size": torch.tensor([h, w]), "gt_boxes": gt, "gt_labels": labels, "gt_crowd": crowd,
                "gt_area": area}


class DetLoader:
    """Batches ``(x [B,3,S,S] normalised, targets)``; with ``train=True`` shuffled and flipped at random."""

    def __init__(self, data: CocoDet, batch_size: int, train: bool = False, seed: int = 0) -> None:
        self.data, self.batch_size, self.train = data, batch_size, train
        self.gen = torch.Generator().manual_seed(seed)
        self.mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        self.std = torch.tensor(STD).view(1, 3, 1, 1)
        self.targets = [data.target(k) for k in range(len(data))]

    def __len__(self) -> int:
        n, b = len(self.data), self.batch_size
        return n // b + (n % b > (1 if self.train else 0))  # training drops a last batch of one (BatchNorm)

    def __iter__(self) -> Iterator[tuple[Tensor, list[dict[str, Tensor]]]]:
        n = len(self.data)
        order = torch.randperm(n, generator=self.gen) if self.train else torch.arange(n)
        for i in range(0, self.batch_size * len(self), self.batch_size):
            idx = order[i:i + self.batch_size].tolist()
            x = torch.stack([self.data.image(k) for k in idx]).float().div_(255)
            ts = [dict(self.targets[k]) for k in idx]
            if self.train:
                flip = torch.rand(len(idx), generator=self.gen) < 0.5
                for j in np.nonzero(flip.numpy())[0].tolist():
                    x[j] = x[j].flip(-1)
                    b = ts[j]["boxes"].clone()
                    b[:, [0, 2]] = self.data.size - ts[j]["boxes"][:, [2, 0]]
                    ts[j]["boxes"] = b
            yield (x - self.mean) / self.std, ts


# ---- the generated set -------------------------------------------------------------------------

GEN_DEFAULTS: dict[str, Any] = {"n_train": 4000, "n_test": 500, "size": 128, "min_side": 20, "max_side": 64,
                                "max_objects": 4, "seed": 0}


def generated_folder(shared: str | Path, **params: Any) -> Path:
    """The COCO folder of the generated set from ``shared`` (holding ``cifar10/`` and ``imagenette224/``),
    written on first use into the cache; returns its path."""
    shared = Path(shared)
    p = GEN_DEFAULTS | params
    srcs = [shared / "cifar10" / "train.tar", shared / "cifar10" / "test.tar",
            shared / "imagenette224" / "train.tar", shared / "imagenette224" / "val.tar"]
    for s in srcs:
        if not s.is_file():
            raise FileNotFoundError(f"the generated detection set needs {s} (cifar10 and imagenette224 under {shared})")
    key = json.dumps(p, sort_keys=True) + "".join(f"{s.stat().st_size}" for s in srcs)
    out = _cache_dir() / f"det_generated-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    if not (out / "annotations" / "instances_test.json").is_file():
        make_generated(shared, out, **p)
    return out


def _backgrounds(tar_path: Path, size: int) -> list[np.ndarray]:
    from PIL import Image

    out = []
    with tarfile.open(tar_path) as tar:
        for m in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
            img = Image.open(io.BytesIO(tar.extractfile(m).read())).convert("RGB")
            out.append(np.asarray(img.resize((size, size), Image.BILINEAR), dtype=np.uint8))
    return out


def make_generated(shared: str | Path, out: str | Path, n_train: int = 4000, n_test: int = 500, size: int = 128,
                   min_side: int = 20, max_side: int = 64, max_objects: int = 4, seed: int = 0) -> Path:
    """Write the generated set (JPEG images + COCO json) to ``out``; deterministic for given arguments."""
    from PIL import Image

    shared, out = Path(shared), Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "annotations").mkdir(parents=True)
    cats = [{"id": k + 1, "name": c, "supercategory": "cifar10"} for k, c in enumerate(CIFAR_CLASSES)]
    for split, n, bg_tar, obj_split, s_off in (("train", n_train, "train.tar", "train", 0),
                                                 ("test", n_test, "val.tar", "test", 1)):
        rng = np.random.default_rng(seed * 2 + s_off)
        bgs = _backgrounds(shared / "imagenette224" / bg_tar, size)
        objs, obj_labels = load_cifar10(shared / "cifar10", obj_split)
        (tmp / split).mkdir()
        images, anns = [], []
        for i in range(n):
            canvas = bgs[rng.integers(len(bgs))].copy()
            if rng.random() < 0.5:
                canvas = canvas[:, ::-1].copy()
            placed: list[tuple[int, int, int, int]] = []
            for _ in range(int(rng.integers(1, max_objects + 1))):
                side = int(rng.integers(min_side, max_side + 1))
                w = int(np.clip(side * np.exp(rng.uniform(-0.2, 0.2)), min_side, size))
                h = int(np.clip(side * np.exp(rng.uniform(-0.2, 0.2)), min_side, size))
                for _try in range(20):
                    x0, y0 = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
                    if all(_iou((x0, y0, w, h), q) < 0.1 for q in placed):
                        break
                else:
                    continue
                k = int(rng.integers(len(obj_labels)))
                canvas[y0:y0 + h, x0:x0 + w] = np.asarray(Image.fromarray(objs[k]).resize((w, h), Image.BILINEAR))
                placed.append((x0, y0, w, h))
                anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(obj_labels[k]) + 1,
                             "bbox": [x0, y0, w, h], "area": w * h, "iscrowd": 0})
            name = f"{i:06d}.jpg"
            Image.fromarray(canvas).save(tmp / split / name, quality=95)
            images.append({"id": i + 1, "file_name": name, "width": size, "height": size})
        (tmp / "annotations" / f"instances_{split}.json").write_text(
            json.dumps({"images": images, "annotations": anns, "categories": cats}))
        log.info("generated %s: %d images, %d objects", split, n, len(anns))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def _iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    ix = max(0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)
