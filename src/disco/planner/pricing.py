"""Programs priced in seconds by a calibration, and one inference's predicted latency (the replay)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..runtime import latency as lat
from ..runtime.transport import LinkModel
from .calibration import Calibration
from .programs import FEATURES


def price(progs: list[list[tuple]], cal: Calibration, speeds: list[float] | None = None,
          compute_ms: list[float] | None = None, codec: str = "fp32") -> list[list[lat.Step]]:
    """Programs in seconds: each feature segment priced by ``cal`` (the link values at ``codec``'s
    encode and decode cost, plus ``cal.run_s`` where it computes ops) and divided by the node's speed;
    ``compute_ms``: rescale each node's segments to this measured total instead (checks of the link model)."""
    w = np.array([cal.flop_s, cal.op_s, cal.msg_s, cal.byte_s,
                  cal.codec_encode_s.get(codec, 0.0), cal.codec_decode_s.get(codec, 0.0)])
    out = []
    for j, p in enumerate(progs):
        sp = 1.0 if speeds is None else float(speeds[j])
        secs = [(float(s[1] @ w[:len(s[1])]) + (cal.run_s if s[1][1] > 0 else 0.0)) / sp if s[0] == "c" else 0.0
                for s in p]
        if compute_ms is not None:
            tot = sum(secs)
            k = compute_ms[j] / 1e3 / tot if tot > 0 else 0.0
            secs = [x * k for x in secs]
        out.append([("c", x) if s[0] == "c" else s for s, x in zip(p, secs, strict=True)])
    return out


def features(progs: list[list[tuple]]) -> np.ndarray:
    """[N, 4]: each node's total FLOPs, ops, messages sent and bytes sent (the fitted features)."""
    k = len(FEATURES)
    return np.array([sum((s[1][:k] for s in p if s[0] == "c"), np.zeros(k)) for p in progs])


def with_overheads(progs: list[list[lat.Step]], per_msg: float, per_byte: float = 0.0,
                   speeds: Sequence[float] | None = None) -> list[list[lat.Step]]:
    """CPU time after every received message: ``per_msg + per_byte * bytes`` (receive-side runtime cost), on
    node j divided by its relative speed ``speeds[j]`` (as :func:`price` divides its compute)."""
    if per_msg <= 0 and per_byte <= 0:
        return progs
    sp = [1.0] * len(progs) if speeds is None else [float(v) for v in speeds[:len(progs)]]
    return [[x for s in p for x in ((s, ("c", (per_msg + per_byte * s[3]) / sp[j])) if s[0] == "w" else (s,))]
            for j, p in enumerate(progs)]


def predict_ms(progs: list[list[lat.Step]], bandwidth_bps: float | None, latency_s: float, cal: Calibration,
               cores: int | None = None, speeds: Sequence[float] | None = None) -> float:
    """Predicted ms of one inference (priced programs, ``speeds`` as :func:`price` had them): ``cores`` host
    cores shared by the node processes (None: one device per node)."""
    link = LinkModel(bandwidth_bps, latency_s)
    if link.shaped:
        progs = with_overheads(progs, cal.overhead_paced_s, cal.overhead_paced_byte_s, speeds)
    else:
        progs = with_overheads(progs, cal.overhead_unshaped_s, cal.overhead_unshaped_byte_s, speeds)
    wake = cal.wake(link.shaped, len(progs) > (cores or len(progs)))
    return lat.replay(progs, link, cores or len(progs), cal.delay(link.shaped), wake, cal.oversub,
                      cal.corun if cores else 1.0, busy_s=cal.busy_s if cores else 0.0) * 1e3
