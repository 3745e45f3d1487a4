"""The Open Inference Protocol (KServe / Triton "v2") over HTTP: tensors in and out, JSON and binary.

An inference request is a JSON object (``id``, ``inputs``: name, datatype, shape, ``data`` or
``parameters.binary_data_size``, ``outputs``, ``parameters``); with the binary tensor extension the body is the
JSON (``Inference-Header-Content-Length`` bytes) followed by the raw little-endian tensors in input order. Every
problem with a request is a :class:`BadRequest` that names it (400).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
DATATYPES = {"FP32": np.dtype("<f4")}  # what the engine computes with; others are refused by name
EXTENSIONS = ["binary_tensor_data"]


class BadRequest(ValueError):
    """A request the server cannot take (400), with what is wrong."""


@dataclass
class TensorSpec:
    """A model input or output as the export defines it."""

    name: str
    shape: list[int]
    datatype: str = "FP32"

    def meta(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass
class InferRequest:
    """A parsed request: the inputs in the model's order, its id, the outputs wanted and how."""

    inputs: list[np.ndarray]
    id: str
    outputs: list[str]
    binary: dict[str, bool]
    timeout_s: float | None


def _header(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        js, rest = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH}: {header_length!r} is not a number") from None
        if not 0 <= n <= len(body):
            raise BadRequest(f"{HEADER_LENGTH} is {n}, the body has {len(body)} bytes")
        js, rest = body[:n], body[n:]
    try:
        req = json.loads(js)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the request is not valid JSON ({e})") from None
    if not isinstance(req, dict):
        raise BadRequest("the request must be a JSON object")
    return req, rest


def parse_request(body: bytes, header_length: str | None, inputs: list[TensorSpec],
                  outputs: list[TensorSpec]) -> InferRequest:
    """Check and decode an inference request against the model's ``inputs`` / ``outputs``."""
    req, rest = _header(body, header_length)
    rid = req.get("id", "")
    if not isinstance(rid, str):
        raise BadRequest("'id' must be a string")
    given = req.get("inputs")
    if not isinstance(given, list) or not all(isinstance(t, dict) for t in given):
        raise BadRequest("'inputs' must be a list of tensors (objects with name, datatype, shape, data)")
    by_name = {}
    for t in given:
        name = t.get("name")
        if name in by_name:
            raise BadRequest(f"input {name!r} is given twice")
        by_name[name] = t
    want = [s.name for s in inputs]
    unknown = [n for n in by_name if n not in want]
    if unknown:
        raise BadRequest(f"unknown input {unknown[0]!r}: the model's inputs are {want}")
    missing = [n for n in want if n not in by_name]
    if missing:
        raise BadRequest(f"missing input {missing[0]!r}: the model's inputs are {want}")
    offset, arrays = 0, {}
    for t in given:  # binary data comes in the order of the request's inputs
        spec = next(s for s in inputs if s.name == t["name"])
        arrays[spec.name], offset = _tensor(t, spec, rest, offset)
    if offset != len(rest):
        raise BadRequest(f"the body has {len(rest) - offset} bytes after the last binary tensor")
    params = req.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    outs, binary = _outputs(req.get("outputs"), outputs, bool(params.get("binary_data_output", False)))
    timeout = params.get("timeout")
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise BadRequest("parameters.timeout must be a positive number (microseconds)")
    return InferRequest([arrays[s.name] for s in inputs], rid, outs, binary,
                        None if timeout is None else float(timeout) / 1e6)


def _tensor(t: dict[str, Any], spec: TensorSpec, rest: bytes, offset: int) -> tuple[np.ndarray, int]:
    name = spec.name
    dt = t.get("datatype")
    if dt not in DATATYPES:
        raise BadRequest(f"input {name!r}: datatype {dt!r}, the model takes {spec.datatype}")
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of integers")
    if shape != list(spec.shape):
        raise BadRequest(f"input {name!r}: shape {shape}, the model takes {list(spec.shape)}")
    dtype, count = DATATYPES[dt], int(np.prod(shape, dtype=np.int64))
    params = t.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if "data" in t:
            raise BadRequest(f"input {name!r}: both 'data' and binary_data_size")
        if not isinstance(size, int) or size != count * dtype.itemsize:
            raise BadRequest(f"input {name!r}: binary_data_size {size}, a {dt}{shape} tensor has "
                             f"{count * dtype.itemsize} bytes")
        if offset + size > len(rest):
            raise BadRequest(f"input {name!r}: the body ends {offset + size - len(rest)} bytes before its binary "
                             "data does (a truncated request?)")
        x = np.frombuffer(rest, dtype=dtype, count=count, offset=offset).reshape(shape)
        return x.astype(np.float32), offset + size
    data = t.get("data")
    if data is None:
        raise BadRequest(f"input {name!r}: no 'data' (nor parameters.binary_data_size)")
    try:
        x = np.asarray(data, dtype=np.float64)
    except (ValueError, TypeError):
        raise BadRequest(f"input {name!r}: 'data' must hold numbers") from None
    if x.size != count:
        raise BadRequest(f"input {name!r}: 'data' has {x.size} values, shape {shape} needs {count}")
    if not np.isfinite(x).all():
        raise BadRequest(f"input {name!r}: 'data' holds a value that is not finite")
    return x.reshape(shape).astype(np.float32), offset


def _outputs(asked: Any, outputs: list[TensorSpec], binary_all: bool) -> tuple[list[str], dict[str, bool]]:
    names = [s.name for s in outputs]
    if asked is None:
        return names, {n: binary_all for n in names}
    if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
        raise BadRequest("'outputs' must be a list of objects with a name")
    got, binary = [], {}
    for o in asked:
        if o.get("name") not in names:
            raise BadRequest(f"unknown output {o.get('name')!r}: the model's outputs are {names}")
        p = o.get("parameters") or {}
        if isinstance(p, dict) and p.get("classification"):
            raise BadRequest("the classification extension is not supported: ask for the output tensor")
        got.append(o["name"])
        binary[o["name"]] = bool(p.get("binary_data", binary_all)) if isinstance(p, dict) else binary_all
    return got, binary


def build_response(model: str, req: InferRequest, values: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The body and headers of the answer: JSON, or JSON + binary tensors when any output is asked binary."""
    outs, blobs = [], []
    for name in req.outputs:
        v = np.ascontiguousarray(values[name], dtype="<f4")
        o: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": list(v.shape)}
        if req.binary.get(name):
            o["parameters"] = {"binary_data_size": v.nbytes}
            blobs.append(v.tobytes())
        else:
            o["data"] = v.reshape(-1).tolist()
        outs.append(o)
    head = {"model_name": model, "model_version": "1", "outputs": outs}
    if req.id:
        head["id"] = req.id
    js = json.dumps(head).encode()
    if not blobs:
        return js, {"content-type": "application/json"}
    return js + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(js))}
