"""DISCO checkpoints: one ``.safetensors`` file whose header metadata carries the JSON.

The tensors are the plain model's ``state_dict`` with the masks already applied (so
torchvision or timm can load them as they are). The JSON (``__metadata__["disco"]``)
holds the format version, the model config, the input shape, the task, and for a
sparsified model the partition fingerprint, N and the kept links (bit-packed); a
SHA-256 over the tensors detects damaged files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import RefusedError

log = logging.getLogger(__name__)

FORMAT = "disco-checkpoint"
VERSION = 1


@dataclass
class Checkpoint:
    """A model's weights with everything needed to rebuild and check it."""

    model: dict[str, Any]  # {"name": ..., "kwargs": {...}}
    state_dict: dict[str, torch.Tensor]
    input_shape: list[int]
    task: str | None = None
    disco: dict[str, Any] | None = None  # nodes, fingerprint, kept (packed), ratio, budget, selection
    info: dict[str, Any] = field(default_factory=dict)  # metrics, training args; free-form

    @property
    def nodes(self) -> int:
        return 1 if self.disco is None else int(self.disco["nodes"])

    def kept(self) -> np.ndarray | None:
        """The kept-link boolean array, or None for a dense checkpoint."""
        if self.disco is None:
            return None
        return unpack_bits(self.disco["kept"], self.disco["n_links"])


def pack_bits(mask: np.ndarray) -> str:
    return base64.b64encode(np.packbits(mask.astype(bool)).tobytes()).decode()


def is_checkpoint(source: str | Path) -> bool:
    """Whether a command's model argument names a checkpoint file (``*.safetensors`` or an existing file)
    rather than a model name: the one place every command decides it."""
    return str(source).endswith(".safetensors") or Path(source).is_file()


def unpack_bits(data: str, n: int) -> np.ndarray:
    raw = np.frombuffer(base64.b64decode(data), dtype=np.uint8)
    return np.unpackbits(raw)[:n].astype(bool)


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes of a state dict (detects damaged files)."""
    h = hashlib.sha256()
    for k in sorted(state):
        t = state[k].detach().cpu().contiguous().reshape(-1)
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def save_checkpoint(ckpt: Checkpoint, path: str | Path) -> Path:
    """Write ``ckpt`` atomically to ``path`` (``.safetensors``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in ckpt.state_dict.items()}
    meta = {
        "format": FORMAT, "version": VERSION, "model": ckpt.model, "input_shape": list(ckpt.input_shape),
        "task": ckpt.task, "disco": ckpt.disco, "info": ckpt.info, "sha256": state_digest(state),
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={"disco": json.dumps(meta)})
    tmp.replace(path)
    log.info("saved checkpoint %s", path)
    return path


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The JSON header of a checkpoint, without reading its tensors."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise RefusedError(f"checkpoint {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("disco")
    except Exception as e:  # safetensors raises several types for a broken header
        raise RefusedError(f"checkpoint {path} is damaged or not a safetensors file: {e}") from e
    if raw is None:
        raise RefusedError(f"{path} is a safetensors file but not a DISCO checkpoint (no 'disco' metadata)")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RefusedError(f"checkpoint {path}: metadata is not valid JSON ({e})") from e
    if meta.get("format") != FORMAT:
        raise RefusedError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise RefusedError(f"{path}: format version {meta.get('version')}, this disco reads {VERSION}")
    return meta


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read and verify a checkpoint (format, version, tensor checksum)."""
    from safetensors.torch import load_file

    meta = read_metadata(path)
    try:
        state = load_file(str(path))
    except Exception as e:
        raise RefusedError(f"checkpoint {path} is damaged: {e}") from e
    if state_digest(state) != meta["sha256"]:
        raise RefusedError(f"checkpoint {path} is damaged: tensor checksum does not match its header")
    return Checkpoint(
        model=meta["model"], state_dict=state, input_shape=meta["input_shape"], task=meta.get("task"),
        disco=meta.get("disco"), info=meta.get("info") or {},
    )
