"""A hand-built 2-rank ONNX export for the engine's tests (ENGINE.md's layout), made with onnx.helper."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SHAPE = [1, 4, 3, 3]
TOKEN = "toy-run-token"


def _graph(path: Path, nodes: list[Any], inputs: list[str], outputs: list[str], inits: dict[str, np.ndarray],
           opset: int = 17) -> None:
    g = helper.make_graph(
        nodes, path.stem, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def build(out: Path, recv_shape: list[int] | None = None, wrong_ref: bool = False, opset: int = 17
          ) -> dict[str, Any]:
    """Rank 0 sends x to rank 1 (input), computes a = relu(x * c0); rank 1 computes b = x * c1 and sends it
    back (links, axis 1); rank 0 adds: out = a + b. ``recv_shape``: rank 0's recv step says another shape;
    ``opset``: rank 1's graph's opset."""
    rng = np.random.default_rng(0)
    c0, c1 = (rng.standard_normal([1, 4, 1, 1]).astype(np.float32) for _ in range(2))
    x = rng.standard_normal(SHAPE).astype(np.float32)
    for r in (0, 1):
        (out / f"rank{r}").mkdir(parents=True, exist_ok=True)
    _graph(out / "rank0" / "seg0.onnx", [helper.make_node("Mul", ["x", "c0"], ["m"]),
                                         helper.make_node("Relu", ["m"], ["a"])], ["x"], ["a"], {"c0": c0})
    _graph(out / "rank0" / "seg1.onnx", [helper.make_node("Add", ["a", "b"], ["y"])], ["a", "b"], ["y"], {})
    _graph(out / "rank1" / "seg0.onnx", [helper.make_node("Mul", ["x", "c1"], ["b"])], ["x"], ["b"], {"c1": c1}, opset)
    msg = {"kind": "links", "tag": 16, "axis": 1, "dtype": "float32"}
    s0 = {"format": "disco-schedule/1", "rank": 0, "nodes": 2,
          "inputs": [{"name": "x", "shape": SHAPE, "dtype": "float32"}],
          "outputs": [{"name": "out", "shape": SHAPE, "dtype": "float32"}],
          "steps": [{"op": "send", "kind": "input", "value": "x", "to": 1, "tag": 1, "axis": 1},
                    {"op": "run", "graph": "seg0.onnx", "inputs": ["x"], "outputs": ["a"]},
                    {"op": "free", "values": ["x"]},
                    {"op": "recv", "value": "b@from1", "from": 1, "shape": recv_shape or SHAPE, **msg},
                    {"op": "run", "graph": "seg1.onnx", "inputs": ["a", "b@from1"], "outputs": ["out"]}]}
    s1 = {**s0, "rank": 1,
          "steps": [{"op": "recv", "kind": "input", "value": "x", "from": 0, "tag": 1, "shape": SHAPE, "axis": 1,
                     "dtype": "float32"},
                    {"op": "run", "graph": "seg0.onnx", "inputs": ["x"], "outputs": ["b@to0"]},
                    {"op": "send", "value": "b@to0", "to": 0, **msg}]}
    ref = np.maximum(x * c0, 0) + x * c1
    np.savez(out / "rank0" / "reference.npz", x=x, out=ref * (1.5 if wrong_ref else 1.0))
    files = {}
    for r, s in ((0, s0), (1, s1)):
        (out / f"rank{r}" / "schedule.json").write_text(json.dumps(s))
        for p in sorted((out / f"rank{r}").iterdir()):
            files[f"rank{r}/{p.name}"] = _sha(p)
    man = {"format": "disco-onnx/1", "model": {"name": "toy"}, "nodes": 2, "ratio": 1.0, "codec": "fp32",
           "bytes_predicted": 4 * int(np.prod(SHAPE)), "run_token": TOKEN, "files": files}
    (out / "manifest.json").write_text(json.dumps(man))
    return man
