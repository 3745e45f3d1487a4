"""The export formats, above both exporters: "torch" (:func:`disco.runtime.export.export`: one weight shard
per node, run by the torch engine) and "onnx" (:func:`disco.runtime.onnx_export.export_onnx`: one folder per
rank of ONNX graphs, run by the torch-free engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ShardError
from .export import export
from .onnx_export import export_onnx

FORMATS = {"torch": export, "onnx": export_onnx}


def exporter(fmt: str) -> Any:
    """The export function of format ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} ({' or '.join(FORMATS)})")
    return FORMATS[fmt]


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path, codec: str = "fp32",
                      fmt: str = "torch") -> dict[str, Any]:
    """Export a sparsified DISCO checkpoint (one with ``disco`` metadata: nodes, kept links)."""
    from ..loading import load

    loaded = load(ckpt_path)  # checks format, checksum and the partition fingerprint
    if loaded.partition is None:
        raise ShardError(f"{ckpt_path} is a dense checkpoint (no DISCO nodes/kept links); sparsify it first, "
                         "or export a dense split with export(model, partition, None, ...)")
    return exporter(fmt)(loaded.model, loaded.partition, loaded.model.kept, out_dir, loaded.ckpt.model, codec=codec,
                         info={"checkpoint": str(ckpt_path), "metrics": loaded.ckpt.info.get("metrics", {}),
                               "task": loaded.ckpt.task, "preprocess": loaded.ckpt.info.get("preprocess")})
