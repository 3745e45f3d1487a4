"""Wire codecs in numpy, byte for byte the format of ``disco.runtime.transport``.

fp32 / fp16: the values cast, C order. int8: ``prod(shape)`` int8 values (round(x / scale) clipped to
[-127, 127]) followed by one float32 scale per channel along ``axis`` (max-abs / 127, at least 1e-30).
"""

from __future__ import annotations

import numpy as np

from .errors import Refused


class Codec:
    """Raw float32 (also the codec of input, output and stats messages)."""

    name = "fp32"
    dtype = np.dtype(np.float32)

    @property
    def bytes_per_value(self) -> int:
        return self.dtype.itemsize

    def nbytes(self, shape: tuple[int, ...], axis: int) -> int:
        """Bytes of the coded message for a value of ``shape``."""
        return int(np.prod(shape, dtype=np.int64)) * self.bytes_per_value

    def encode(self, x: np.ndarray, axis: int) -> np.ndarray:
        """The message bytes for ``x`` (a C-contiguous array whose buffer is sent as is)."""
        return np.ascontiguousarray(x, dtype=self.dtype).reshape(-1).view(np.uint8)

    def decode(self, buf: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
        """The float32 value of ``shape`` from message bytes (length already checked)."""
        return buf.view(self.dtype).reshape(shape).astype(np.float32, copy=False)


class CastCodec(Codec):
    """The values cast to a narrower float type."""

    def __init__(self, name: str, dtype: type) -> None:
        self.name, self.dtype = name, np.dtype(dtype)


class Int8Codec(Codec):
    """int8 values with one float32 scale per channel along ``axis``, the scales after the values."""

    name = "int8"
    dtype = np.dtype(np.int8)

    def nbytes(self, shape: tuple[int, ...], axis: int) -> int:
        return int(np.prod(shape, dtype=np.int64)) + 4 * int(shape[axis])

    def encode(self, x: np.ndarray, axis: int) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        dims = tuple(d for d in range(x.ndim) if d != axis)
        amax = np.abs(x).max(axis=dims, keepdims=True) if dims else np.abs(x)
        scale = np.maximum(amax / np.float32(127.0), np.float32(1e-30)).astype(np.float32)
        q = np.clip(np.round(x / scale), -127, 127).astype(np.int8)
        return np.concatenate([q.reshape(-1).view(np.uint8), np.ascontiguousarray(scale).reshape(-1).view(np.uint8)])

    def decode(self, buf: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
        n = int(np.prod(shape, dtype=np.int64))
        q = buf[:n].view(np.int8).reshape(shape).astype(np.float32)
        sshape = [1] * len(shape)
        sshape[axis] = shape[axis]
        scale = buf[n:].copy().view(np.float32).reshape(sshape)
        return q * scale


CODECS: dict[str, Codec] = {"fp32": Codec(), "fp16": CastCodec("fp16", np.float16), "int8": Int8Codec()}
RAW = CODECS["fp32"]


def get_codec(name: str) -> Codec:
    """The codec called ``name`` (bf16 is a torch engine codec only: numpy has no bfloat16)."""
    try:
        return CODECS[name]
    except KeyError:
        raise Refused(f"unknown codec {name!r} for the onnxruntime engine; choose one of {', '.join(CODECS)}"
                      ) from None
