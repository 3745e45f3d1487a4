"""What every recipe shares: running one ``disco`` command and caching a step's JSON result."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def disco(*args: str, threads: int | None) -> dict:
    """Run one ``disco`` command (echoed with ``+``) and return its last JSON line."""
    cmd = [sys.executable, "-m", "disco.cli", *args, *(["--threads", str(threads)] if threads else [])]
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cached(path: Path, fn: Callable[[], dict], source: Path | None = None) -> dict:
    """``fn()``'s result, stored in ``path`` so that a rerun skips it (unless ``source`` is newer)."""
    if path.is_file() and (source is None or path.stat().st_mtime >= source.stat().st_mtime):
        return json.loads(path.read_text())
    res = fn()
    path.write_text(json.dumps(res))
    return res


def sparsify_run(runs: Path, dense: Path, data: str, name: str, nodes: int, ratio: float, epochs: int,
                 flags: list[str], *, budget: str = "global", selection: str = "magnitude", threads: int | None = 1,
                 lr: float | None = None, **fields: object) -> dict:
    """One DISCO run of a recipe: ``disco sparsify`` from ``dense`` into ``runs/NAME.safetensors``, its result
    (with ``name``, ``epochs``, ``lr`` if given and ``fields``) kept in ``runs/NAME.json``; skipped when both
    exist. ``lr`` overrides a ``--lr`` in ``flags`` (it comes after them)."""
    out, res_file = runs / f"{name}.safetensors", runs / f"{name}.json"
    if out.is_file() and res_file.is_file():
        return json.loads(res_file.read_text())
    res = disco("sparsify", str(dense), "--data", data, "--nodes", str(nodes), "--ratio", str(ratio),
                "--budget", budget, "--selection", selection, "--epochs", str(epochs), *flags,
                *(["--lr", str(lr)] if lr is not None else []), "--out", str(out), threads=threads)
    res.update(name=name, epochs=epochs, **({"lr": lr} if lr is not None else {}), **fields)
    res_file.write_text(json.dumps(res))
    return res


def epochs_of(spec: tuple, default: int, at: int = 3) -> int:
    """A run row's fine-tuning epochs: the optional int field after the first ``at`` ones, else ``default``."""
    return spec[at] if len(spec) > at and isinstance(spec[at], int) else default


def options_of(spec: tuple) -> dict:
    """A run row's optional last field: ``sparsify_run`` keywords such as ``{"selection": "taylor", "lr": 1e-3}``."""
    return spec[-1] if isinstance(spec[-1], dict) else {}
