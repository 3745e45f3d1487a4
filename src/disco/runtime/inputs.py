"""The leader's input: a user's tensor file, or the export's shipped reference input with its outputs."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import RefusedError

Reference = dict[str, torch.Tensor]


def load_reference(man: dict[str, Any], d: Path) -> tuple[torch.Tensor, Reference]:
    """The export's reference input and the single-process outputs on it (by name), checked against the
    manifest's ``reference_sha256``."""
    from safetensors.torch import load_file

    from .export import file_sha256

    f = d / "reference.safetensors"
    if not f.is_file():
        raise RefusedError(f"{d} has no reference.safetensors (the start-up self-test needs it): export it again")
    if file_sha256(f) != man["reference_sha256"]:
        raise RefusedError(f"{d / 'manifest.json'}: field 'reference_sha256' does not match {f.name}")
    try:
        t = load_file(str(f))
        x = t.pop("input")
    except Exception as e:  # damaged file
        raise RefusedError(f"cannot read input {f}: {type(e).__name__}: {_first_line(e)}") from e
    check_input(x, man)
    return x, t


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def _read_tensor(path: str) -> Any:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        t = load_file(path)
        return t.get("input", next(iter(t.values())))
    if path.endswith(".npy"):
        return torch.from_numpy(np.load(path, allow_pickle=False))
    return torch.load(path, map_location="cpu", weights_only=True)


def load_input(path: str | None, man: dict[str, Any], d: Path) -> tuple[torch.Tensor, Reference | None]:
    """The input tensor and, for the export's probe (``path`` None), the single-process reference outputs."""
    if path is None:
        return load_reference(man, d)
    try:
        x = _read_tensor(path)
    except Exception as e:  # missing, damaged or not a tensor file
        why = ("not a tensor file (.safetensors with 'input', .pt of a tensor, .npy)"
               if isinstance(e, pickle.UnpicklingError) else _first_line(e))
        raise RefusedError(f"cannot read input {path}: {type(e).__name__}: {why}") from e
    check_input(x, man)
    return x, None


def check_input(x: Any, man: dict[str, Any]) -> None:
    """Refuse an input that is not a float32 tensor of the exported input shape."""
    if not isinstance(x, torch.Tensor):
        raise RefusedError(f"input must be a tensor, got {type(x).__name__}")
    want = tuple(man["input_shape"])
    if tuple(x.shape) != want:
        raise RefusedError(f"input has shape {tuple(x.shape)}, the model was exported for {want}")
    if x.dtype != torch.float32:
        raise RefusedError(f"input has dtype {x.dtype}, expected torch.float32")
