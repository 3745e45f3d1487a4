"""A small Open Inference Protocol client for ``disco infer`` (urllib + numpy; binary tensors both ways), and the
image preprocessing an export carries (``manifest["preprocess"]``, shown in the model's metadata)."""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RefusedError, RunFailure

log = logging.getLogger(__name__)
TOKEN_ENV = "DISCO_SERVE_TOKEN"
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
HEADER_LENGTH = "Inference-Header-Content-Length"


class Client:
    """One server (``url``: ``http://host:port``, or ``.../v2/models/NAME``) and its model."""

    def __init__(self, url: str, model: str | None = None, token: str | None = None, timeout: float = 60.0) -> None:
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        parts = [p for p in u.path.split("/") if p]
        if len(parts) >= 3 and parts[:2] == ["v2", "models"]:
            model = model or parts[2]
        self.base = f"{u.scheme}://{u.netloc}"
        self.token = token or os.environ.get(TOKEN_ENV)
        self.timeout = timeout
        self.model = model or self._only_model()

    def _call(self, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
              ) -> tuple[dict[str, str], bytes]:
        h = dict(headers or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=body, headers=h, method="POST" if body is not None
                                     else "GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                why = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                why = raw[:200].decode(errors="replace")
            cls = RefusedError if e.code in (400, 401, 404, 413) else RunFailure
            raise cls(f"{self.base}{path}: HTTP {e.code}: {why}") from None
        except OSError as e:
            raise RunFailure(f"{self.base}{path}: cannot reach the server ({e})") from None

    def _only_model(self) -> str:
        _, raw = self._call("/v2/repository/index", b"{}", {"Content-Type": "application/json"})
        models = json.loads(raw)
        if len(models) != 1:
            raise RefusedError(f"{self.base} serves {len(models)} models: name one (--model)")
        return str(models[0]["name"])

    def metadata(self) -> dict[str, Any]:
        """The model's metadata (inputs, outputs, and ``parameters.preprocess`` when the export has it)."""
        return json.loads(self._call(f"/v2/models/{self.model}")[1])

    def infer(self, inputs: dict[str, np.ndarray], rid: str = "") -> dict[str, np.ndarray]:
        """One request with binary tensors; the outputs by name."""
        head: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": True}}
        if rid:
            head["id"] = rid
        blobs = []
        for name, x in inputs.items():
            x = np.ascontiguousarray(x, dtype="<f4")
            head["inputs"].append({"name": name, "datatype": "FP32", "shape": list(x.shape),
                                   "parameters": {"binary_data_size": x.nbytes}})
            blobs.append(x.tobytes())
        js = json.dumps(head).encode()
        h, raw = self._call(f"/v2/models/{self.model}/infer", js + b"".join(blobs),
                            {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(js))})
        n = int({k.lower(): v for k, v in h.items()}.get(HEADER_LENGTH.lower(), len(raw)))
        resp, rest, off, out = json.loads(raw[:n]), raw[n:], 0, {}
        for o in resp["outputs"]:
            size = (o.get("parameters") or {}).get("binary_data_size")
            if size is None:
                out[o["name"]] = np.asarray(o["data"], dtype=np.float32).reshape(o["shape"])
            else:
                out[o["name"]] = np.frombuffer(rest, dtype="<f4", count=size // 4, offset=off).reshape(o["shape"])
                off += size
        return out


def preprocessing(meta: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The export's preprocessing (size, mean, std, scale, labels) and whether it came from the export (else
    the input's size with ImageNet's mean and std)."""
    pre = (meta.get("parameters") or {}).get("preprocess")
    shape = meta["inputs"][0]["shape"]
    if isinstance(pre, dict) and "size" in pre:
        return {"scale": 255.0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD, **pre}, True
    return {"size": [int(shape[-2]), int(shape[-1])], "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
            "scale": 255.0}, False


def load_image(path: str | Path, pre: dict[str, Any]) -> np.ndarray:
    """A photo as the 1 x 3 x H x W float32 the model takes: RGB, resized to ``size`` (shorter side, then the
    centre crop), ``(uint8 / scale - mean) / std``."""
    from PIL import Image

    h, w = (int(v) for v in pre["size"])
    try:
        img = Image.open(path).convert("RGB")
    except (OSError, ValueError) as e:
        raise RefusedError(f"{path}: cannot read it as an image ({e})") from None
    s = max(h / img.height, w / img.width)
    img = img.resize((max(w, round(img.width * s)), max(h, round(img.height * s))), Image.BILINEAR)
    left, top = (img.width - w) // 2, (img.height - h) // 2
    img = img.crop((left, top, left + w, top + h))
    x = np.asarray(img, dtype=np.float32) / float(pre.get("scale", 255.0))
    x = (x - np.asarray(pre["mean"], np.float32)) / np.asarray(pre["std"], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def top_k(logits: np.ndarray, k: int = 5) -> list[tuple[int, float]]:
    """(class index, probability) of the ``k`` most probable classes (softmax over the last axis)."""
    z = logits.reshape(-1).astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    idx = np.argsort(-p)[:k]
    return [(int(i), float(p[i])) for i in idx]
