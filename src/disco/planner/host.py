"""This host against the calibration's: the model timed here in one process, the CPU costs scaled to it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..runtime import latency as lat
from .calibration import Calibration
from .pricing import price
from .programs import programs

CPU_FIELDS = ("flop_s", "op_s", "msg_s", "byte_s", "overhead_unshaped_s", "overhead_paced_s",
              "overhead_unshaped_byte_s", "overhead_paced_byte_s")


def time_one_process(model: Any, shape: tuple[int, ...], reps: int = 5) -> float:
    """Median ms of one forward of ``model`` in this process on one torch thread (after one warm-up)."""
    import statistics
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(shape)
        ts = []
        with torch.no_grad():
            model(x)
            for _ in range(reps):
                t0 = time.perf_counter()
                model(x)
                ts.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(ts) * 1e3


def scaled_to_host(cal: Calibration, model: Any, name: str, shape: tuple[int, ...],
                   measured_ms: float | None = None) -> tuple[Calibration, dict[str, Any]]:
    """``cal`` with its CPU costs (compute, per-message and per-byte CPU, codecs) scaled to this host: the
    factor is the model's one-process time here (``measured_ms``, else timed now) over the calibration's (its
    measured one-process time for this model and shape, else its compute model's). Link delays are kept."""
    ref = single_process(model, name, shape, cal)
    here = time_one_process(model, shape) if measured_ms is None else measured_ms
    f = here / ref["ms"]
    scaled = {k: getattr(cal, k) * f for k in CPU_FIELDS}
    key = f"{name}|{','.join(map(str, shape))}"
    new = replace(
        cal, **scaled, single_process={**cal.single_process, key: round(here, 2)},
        codec_encode_s={k: v * f for k, v in cal.codec_encode_s.items()},
        codec_decode_s={k: v * f for k, v in cal.codec_decode_s.items()},
        single_process_source="timed on this host", source=f"{cal.source}, CPU costs x {f:.2f} for this host")
    return new, {"one_process_ms_here": round(here, 2), "one_process_ms_calibration": ref["ms"],
                 "calibration_one_process_source": ref["source"], "cpu_factor": round(f, 3)}


def single_process(model: Any, name: str, shape: tuple[int, ...], cal: Calibration) -> dict[str, Any]:
    """The one-process baseline: measured (the calibration's ``single_process``) at this input shape, else
    predicted."""
    key = f"{name}|{','.join(map(str, shape))}"
    if key in cal.single_process:
        return {"ms": cal.single_process[key], "source": f"measured ({cal.single_process_source})"}
    from ..cost import estimate
    from ..graph import partition

    part = partition(model, shape, 1)
    progs = price(programs(part, part.all_links(), "fp32"), cal)
    return {"ms": round(lat.compute_s(progs[0]) * 1e3, 2), "source": "predicted (compute model)",
            "params": estimate(part).params_dense}
