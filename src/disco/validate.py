"""One place that checks every user-supplied value, before any work starts.

Every ``disco`` command (and the node program) reads its options through these checks. A refused
value raises :class:`~disco.errors.RefusedError` (a ``ValueError``), which the command line turns into one line on
stderr and exit code 2. The ``*_arg`` functions are the same checks shaped as ``argparse`` types, so
a bad value is refused while the arguments are parsed.

Units: a bandwidth needs a bit-rate unit (``100mbit``, ``1gbit``, ``500kbit``, ``100mbps``); a
latency needs a time unit (``2ms``, ``500us``, ``0.01s``). A bare number (``2``), ``0``, a
negative value and byte units (``100mb``, ``10MB/s``) are refused, because each has been read as
something else by someone.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from .errors import RefusedError

log = logging.getLogger(__name__)

T = TypeVar("T")

CODEC_NAMES = ("fp32", "fp16", "bf16", "int8")
DEFAULT_INPUT_SHAPE = (1, 3, 224, 224)  # torchvision/timm models without a better-known size


# ---- numbers ----------------------------------------------------------------------------------

def check_nodes(nodes: int, *, minimum: int = 2, what: str = "--nodes") -> int:
    """N as an int >= ``minimum`` (2 where a split is meant: one node is not a split)."""
    if isinstance(nodes, bool) or not isinstance(nodes, int):
        raise RefusedError(f"{what} must be a whole number, got {nodes!r}")
    if nodes < minimum:
        extra = " (one node is not a split: use the dense model)" if minimum == 2 and nodes == 1 else ""
        raise RefusedError(f"{what} must be >= {minimum}, got {nodes}{extra}")
    return nodes


def check_ratio(ratio: float, what: str = "--ratio") -> float:
    """A communication ratio r in [0, 1] (0 = separated branches, 1 = dense)."""
    r = _number(ratio, what)
    if not 0.0 <= r <= 1.0:
        raise RefusedError(f"{what} must be in [0, 1] (0 = separated branches, 1 = dense), got {ratio}")
    return r


def check_positive(value: T, what: str, *, allow_none: bool = True) -> T:
    """``value`` > 0 (epochs, limits, iterations, batch size, timeouts); None passes if allowed."""
    if value is None and allow_none:
        return value
    v = _number(value, what)
    if not v > 0:
        raise RefusedError(f"{what} must be > 0, got {value}")
    return value


def check_nonnegative(value: T, what: str) -> T:
    """``value`` >= 0 (warm-up count, stream depth, loss weights)."""
    if value is None:
        return value
    v = _number(value, what)
    if v < 0:
        raise RefusedError(f"{what} must be >= 0, got {value}")
    return value


def _number(value: Any, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise RefusedError(f"{what} must be a number, got {value!r}") from None
    if math.isnan(v) or math.isinf(v):
        raise RefusedError(f"{what} must be a finite number, got {value!r}")
    return v


# ---- units ------------------------------------------------------------------------------------

from disco_edge.link import BANDWIDTH_RE, LATENCY_RE, UNSHAPED  # noqa: E402 - one option syntax for both engines


def parse_bandwidth(s: str | None) -> float | None:
    """Per-node link bandwidth in bits/s: ``'100mbit'`` -> 1e8. None or ``'none'``/``'inf'``: unshaped."""
    if s is None or str(s).strip().lower() in UNSHAPED:
        return None
    text = str(s).strip()
    m = BANDWIDTH_RE.match(text)
    if not m:
        if re.match(r"^-", text):
            raise RefusedError(f"bandwidth must be positive, got {s!r}")
        hint = (" (a byte unit or no unit is ambiguous: write bits, e.g. 100mbit)"
                if re.match(r"^[0-9.]+\s*[kmgt]?(b|byte|bytes|b/s)?$", text, re.I) else "")
        raise RefusedError(f"cannot parse bandwidth {s!r}{hint}; write e.g. 10mbit, 100mbit, 1gbit")
    bps = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    if bps <= 0:
        raise RefusedError(f"bandwidth must be > 0, got {s!r} (leave --bandwidth out for an unshaped link)")
    return bps


def parse_latency(s: str | None) -> float:
    """One-way latency per message in seconds: ``'2ms'`` -> 0.002; None: no added latency."""
    if s is None:
        return 0.0
    text = str(s).strip()
    m = LATENCY_RE.match(text)
    if not m:
        if text.startswith("-"):
            raise RefusedError(f"latency must be >= 0, got {s!r}")
        hint = " (a bare number has no unit)" if re.match(r"^[0-9.]+$", text) else ""
        raise RefusedError(f"cannot parse latency {s!r}{hint}; write e.g. 2ms, 500us, 0.01s")
    return float(m.group(1)) * {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2).lower()]


def check_codec(name: str) -> str:
    """A wire codec name: fp32, fp16, bf16 or int8."""
    if name not in CODEC_NAMES:
        raise RefusedError(f"unknown codec {name!r}; choose one of {', '.join(CODEC_NAMES)}")
    return name


# ---- input shapes -----------------------------------------------------------------------------

def parse_shape(s: str | Sequence[int]) -> tuple[int, ...]:
    """``'1,3,32,32'`` -> (1, 3, 32, 32); every size a positive integer."""
    try:
        shape = tuple(int(v) for v in (s.split(",") if isinstance(s, str) else s))
    except (TypeError, ValueError):
        raise RefusedError(f"expected comma-separated integers like 1,3,32,32, got {s!r}") from None
    if not shape or any(v <= 0 for v in shape):
        raise RefusedError(f"every size of an input shape must be > 0, got {s!r}")
    return shape


def default_input_shape(name: str, model: nn.Module | None = None) -> tuple[int, ...]:
    """The input shape a model is meant for: its registered shape, its task's, timm's, else 1,3,224,224."""
    from .models import registered_input_shape

    shape = registered_input_shape(name)
    if shape is not None:
        return shape
    from .tasks import task_for_model

    task = task_for_model(name)
    if task is not None:
        shape = task.input_shape
        if isinstance(shape, property):  # a task whose shape follows its settings (image folder)
            shape = task().input_shape
        return tuple(shape)
    if model is not None:
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
        size = cfg.get("input_size") if isinstance(cfg, dict) else None
        if size and len(size) == 3:
            return (1, *(int(v) for v in size))
        img = getattr(model, "image_size", None)
        if isinstance(img, int):
            return (1, 3, img, img)
    return DEFAULT_INPUT_SHAPE


def first_mixing_layer(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The first convolution or linear layer in definition order (the one the input meets first)."""
    for name, m in model.named_modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            return name, m
    return None


def check_input_shape(model: nn.Module, shape: Sequence[int], name: str = "the model",
                      probe: bool = True) -> tuple[int, ...]:
    """Refuse an input shape of the wrong rank or channel count, or one the model's forward rejects.

    ``probe`` runs the model once on zeros of that shape (batch 1) so that a shape the model
    cannot take is refused here, in one line, instead of deep inside tracing.
    """
    import torch

    shape = parse_shape(shape)
    first = first_mixing_layer(model)
    if first is not None:
        lname, layer = first
        if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            rank = 3 if isinstance(layer, nn.Conv1d) else 5 if isinstance(layer, nn.Conv3d) else 4
            if len(shape) != rank:
                raise RefusedError(f"{name} takes a {rank}-d input (batch, channels, ...), got input shape "
                                 f"{_fmt(shape)}; e.g. {_fmt(default_input_shape(name, model))}")
            if shape[1] != layer.in_channels:
                raise RefusedError(f"{name} takes {layer.in_channels} input channels (its first layer {lname}), "
                                 f"got input shape {_fmt(shape)}")
    if probe:
        x = torch.zeros((1, *shape[1:]))
        try:
            with torch.no_grad():
                was = model.training
                model.eval()
                model(x)
                model.train(was)
        except Exception as e:  # the model's own forward refuses the shape
            msg = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
            raise RefusedError(f"{name} cannot take input shape {_fmt(shape)}: {msg}; its usual shape is "
                             f"{_fmt(default_input_shape(name, model))}") from None
    return shape


def _fmt(shape: Sequence[int]) -> str:
    return ",".join(str(v) for v in shape)


def check_nodes_fit(model: nn.Module, nodes: int, name: str = "the model") -> None:
    """Refuse N when some node would own no channel of any layer; warn when N exceeds the narrowest layer."""
    widths = [(n, m.out_channels if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) else m.out_features)
              for n, m in model.named_modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear))]
    if not widths:
        return
    widest = max(w for _, w in widths)
    if nodes > widest:
        raise RefusedError(f"--nodes {nodes} is more than the widest layer of {name} ({widest} channels): "
                         f"{nodes - widest} nodes would own nothing")
    lname, narrow = min(widths, key=lambda t: t[1])
    if nodes > narrow:
        log.warning("--nodes %d is more than the %d output channels of %s's narrowest layer %s: "
                    "%d nodes own none of its channels", nodes, narrow, name, lname, nodes - narrow)


# ---- files ------------------------------------------------------------------------------------

def prepare_output(path: str | Path, create: bool = True) -> Path:
    """An output file's path: refused if it is an existing folder; its parent folders are created (with
    ``create=False`` the caller creates them once the other inputs are checked)."""
    out = Path(path)
    if out.is_dir():
        raise RefusedError(f"--out {path} is a folder; give a file name, e.g. {out / 'model.safetensors'}")
    if create:
        out.parent.mkdir(parents=True, exist_ok=True)
    return out


def check_data_folder(path: str | Path, what: str = "--data") -> Path:
    """A dataset folder that exists (the layout itself is checked by the task's loader)."""
    p = Path(path)
    if not p.exists():
        raise RefusedError(f"{what} {path} does not exist")
    if not p.is_dir():
        raise RefusedError(f"{what} {path} is not a folder")
    return p


# ---- argparse adapters ------------------------------------------------------------------------

def as_arg(fn: Callable[[str], T], name: str | None = None) -> Callable[[str], T]:
    """Wrap a check as an argparse ``type=`` (the refusal's message becomes the parser's error)."""

    def conv(s: str) -> T:
        try:
            return fn(s)
        except RefusedError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    conv.__name__ = name or fn.__name__
    return conv


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise RefusedError(f"expected a whole number, got {s!r}") from None


def _positive_int(s: str) -> int:
    v = _int(s)
    if v <= 0:
        raise RefusedError(f"must be > 0, got {s}")
    return v


def _nonnegative_int(s: str) -> int:
    v = _int(s)
    if v < 0:
        raise RefusedError(f"must be >= 0, got {s}")
    return v


def _positive_float(s: str) -> float:
    v = _number(s, "value")
    if v <= 0:
        raise RefusedError(f"must be > 0, got {s}")
    return v


def _nonnegative_float(s: str) -> float:
    v = _number(s, "value")
    if v < 0:
        raise RefusedError(f"must be >= 0, got {s}")
    return v


def _nodes(s: str) -> int:
    return check_nodes(_int(s), what="N")


def _ratio(s: str) -> float:
    return check_ratio(_number(s, "r"), what="r")


def _fraction(s: str) -> float:
    v = _number(s, "value")
    if not 0.0 <= v <= 1.0:
        raise RefusedError(f"must be in [0, 1], got {s}")
    return v


def parse_shares(s: str) -> tuple[float, ...]:
    """``'2,1'`` -> (2.0, 1.0): each node's share of every layer's channels, all > 0."""
    try:
        v = tuple(float(x) for x in s.split(","))
    except ValueError:
        raise RefusedError(f"expected comma-separated positive numbers like 2,1, got {s!r}") from None
    if len(v) < 2 or not all(x > 0 and math.isfinite(x) for x in v):
        raise RefusedError(f"shares must be two or more positive numbers, got {s!r}")
    return v


def _bandwidth(s: str) -> str:
    parse_bandwidth(s)
    return s


def _latency(s: str) -> str:
    parse_latency(s)
    return s


positive_int = as_arg(_positive_int, "positive_int")
nonnegative_int = as_arg(_nonnegative_int, "nonnegative_int")
positive_float = as_arg(_positive_float, "positive_float")
nonnegative_float = as_arg(_nonnegative_float, "nonnegative_float")
nodes_arg = as_arg(_nodes, "nodes")
ratio_arg = as_arg(_ratio, "ratio")
fraction_arg = as_arg(_fraction, "fraction")
shares_arg = as_arg(parse_shares, "shares")
shape_arg = as_arg(parse_shape, "shape")
bandwidth_arg = as_arg(_bandwidth, "bandwidth")  # keeps the text; parse_bandwidth gives bits/s
latency_arg = as_arg(_latency, "latency")  # keeps the text; parse_latency gives seconds
codec_arg = as_arg(check_codec, "codec")
