"""CIFAR-10 from the shared tar-of-JPEGs copy or from torchvision's ``cifar-10-batches-py``.

The python batches are pickles; they are read by an unpickler that can build nothing but plain
containers and NumPy arrays (no other global is looked up), so a crafted file in a data folder
cannot run code: it is refused by name.

The whole split is decoded once into a uint8 array (cached beside the user's cache
directory) and augmented per batch in torch: on 2 CPU cores this is much faster than
a ``Dataset`` of PIL images.
"""

from __future__ import annotations

import copy
import hashlib
import io
import logging
import os
import pickle
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

log = logging.getLogger(__name__)

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _cache_dir() -> Path:
    d = Path(os.environ.get("DISCO_CACHE", Path.home() / ".cache" / "disco"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _read_tar(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image
    from tqdm import tqdm

    images, labels = [], []
    with tarfile.open(path, "r") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.lower().endswith((".jpg", ".png"))]
        for m in tqdm(members, desc=f"decoding {path.name}", unit="img", leave=False):
            cls = Path(m.name).parent.name
            if cls not in CLASSES:
                raise ValueError(f"{path}: member {m.name} is not under a CIFAR-10 class folder")
            img = Image.open(io.BytesIO(tar.extractfile(m).read())).convert("RGB")
            images.append(np.asarray(img, dtype=np.uint8))
            labels.append(CLASSES.index(cls))
    return np.stack(images), np.asarray(labels, dtype=np.int64)


# the only globals a CIFAR batch needs (NumPy arrays); anything else in a pickle is refused
_ARRAY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                  ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}  # bytes under protocol 2


class _ArrayUnpickler(pickle.Unpickler):
    """Builds dicts, lists, numbers, strings and NumPy arrays; refuses every other global (no code runs)."""

    def find_class(self, module: str, name: str) -> type:
        if (module, name) not in _ARRAY_GLOBALS:
            raise pickle.UnpicklingError(f"refused global {module}.{name} (a CIFAR batch holds only arrays)")
        if module == "_codecs":
            import codecs

            return codecs.encode
        if name == "_reconstruct":
            try:
                from numpy._core.multiarray import _reconstruct
            except ImportError:  # NumPy 1
                from numpy.core.multiarray import _reconstruct
            return _reconstruct
        return getattr(np, name)


def read_batch(path: Path) -> dict:
    """One ``cifar-10-batches-py`` file as a dict, without executing anything it names."""
    try:
        with open(path, "rb") as f:
            d = _ArrayUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a CIFAR-10 python batch: {e}") from e
    if not isinstance(d, dict):
        raise ValueError(f"{path} is not a CIFAR-10 python batch (holds a {type(d).__name__})")
    d = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in d.items()}
    if "data" not in d or "labels" not in d:
        raise ValueError(f"{path} is not a CIFAR-10 python batch (keys {sorted(map(str, d))[:5]})")
    return d


def _read_batches(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    xs, ys = [], []
    for n in names:
        d = read_batch(folder / n)
        xs.append(np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(np.asarray(d["labels"], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def load_cifar10(root: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images uint8 [N,32,32,3], labels int64 [N])`` for ``split`` in {train, test}.

    ``root`` is either a folder with ``train.tar``/``test.tar`` (JPEG copy) or torchvision's
    layout (a folder holding ``cifar-10-batches-py`` or that folder itself).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = Path(root)
    tar = root / f"{split}.tar"
    if tar.is_file():
        st = tar.stat()
        key = hashlib.sha1(f"{tar.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
        cache = _cache_dir() / f"cifar10-{split}-{key}.npz"
        if cache.is_file():
            d = np.load(cache)
            return d["x"], d["y"]
        x, y = _read_tar(tar)
        tmp = cache.with_suffix(f".tmp{os.getpid()}.npz")  # processes that build the cache at once each write theirs
        np.savez(tmp, x=x, y=y)
        tmp.replace(cache)
        return x, y
    for folder in (root / "cifar-10-batches-py", root):
        if (folder / "test_batch").is_file():
            return _read_batches(folder, split)
    raise FileNotFoundError(
        f"{root} holds no CIFAR-10: expected train.tar/test.tar (JPEG copy) or torchvision's cifar-10-batches-py"
    )


class CifarLoader:
    """Batches of normalised tensors; with ``train=True`` shuffled, padded-crop and flip augmented."""

    def __init__(
        self, root: str | Path, split: str, batch_size: int = 128, train: bool = False,
        limit: int | None = None, seed: int = 0, rank: int = 0, world: int = 1,
    ) -> None:
        x, y = load_cifar10(root, split)
        if limit is not None:  # a class-balanced deterministic subset (the tars are sorted by class)
            keep = np.random.default_rng(1234).permutation(len(y))[:limit]
            x, y = x[np.sort(keep)], y[np.sort(keep)]
        self.x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()  # uint8 NCHW
        self.y = torch.from_numpy(y)
        self.batch_size, self.train = batch_size, train
        self.rank, self.world = rank, world  # under torch.distributed each rank reads its share
        self.gen = torch.Generator().manual_seed(seed)
        self.mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        self.std = torch.tensor(STD).view(1, 3, 1, 1)

    def _count(self) -> int:
        n = len(self.y)
        if self.train:  # padded to a multiple of world (as DistributedSampler): every rank does the same steps
            return (n + self.world - 1) // self.world
        return len(range(self.rank, n, self.world))

    def __len__(self) -> int:
        return (self._count() + self.batch_size - 1) // self.batch_size

    def restrict(self, n: int, seed: int) -> CifarLoader:
        """Keep ``n`` images drawn with ``seed`` (a fixed subset per seed); returns ``self``."""
        if not 0 < n <= len(self.y):
            raise ValueError(f"a subset of {n} images is not possible from a split of {len(self.y)}")
        keep = np.sort(np.random.default_rng(seed).permutation(len(self.y))[:n])
        self.x, self.y = self.x[keep], self.y[keep]
        return self

    def holdout(self, n: int) -> CifarLoader:
        """Carve a validation split: ``n`` images drawn once (the same for every seed and run) leave this
        loader; returns an unaugmented loader of them (for tuning without the test set)."""
        if not 0 < n < len(self.y):
            raise ValueError(f"a validation split of {n} images is not possible from a split of {len(self.y)}")
        perm = np.random.default_rng(4321).permutation(len(self.y))
        val = copy.copy(self)
        val.x, val.y, val.train, val.batch_size = self.x[np.sort(perm[:n])], self.y[np.sort(perm[:n])], False, 500
        self.x, self.y = self.x[np.sort(perm[n:])], self.y[np.sort(perm[n:])]
        return val

    def _augment(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        padded = torch.nn.functional.pad(x, (4, 4, 4, 4), mode="reflect")
        dx = torch.randint(0, 9, (n,), generator=self.gen)
        dy = torch.randint(0, 9, (n,), generator=self.gen)
        out = torch.stack([padded[i, :, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32] for i in range(n)])
        flip = torch.rand(n, generator=self.gen) < 0.5
        out[flip] = out[flip].flip(3)
        return out

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        n = len(self.y)
        order = torch.randperm(n, generator=self.gen) if self.train else torch.arange(n)
        if self.world > 1:
            if self.train:  # the same permutation on every rank (same seed), padded, then strided
                pad = self._count() * self.world - n
                order = torch.cat([order, order[:pad]])
            order = order[self.rank::self.world]
        for i in range(0, len(order), self.batch_size):
            idx = order[i:i + self.batch_size]
            x = self.x[idx].float().div_(255)
            if self.train:
                x = self._augment(x)
            yield (x - self.mean) / self.std, self.y[idx]
