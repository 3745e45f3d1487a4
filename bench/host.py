"""The benchmark host: other project jobs that would share the CPU (found in /proc), the load average."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def foreign_jobs() -> list[str]:
    """Other CPU-heavy project jobs on this host (training, sparsification, recipes, tests)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            args = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if len(args) < 2 or "python" not in Path(args[0]).name:
            continue
        head = args[1:3]
        if ("-m" in head and ("disco.cli" in head or "pytest" in head)) or args[1].endswith(("/bin/disco", "pytest")) \
                or (args[1].startswith("recipes/") or "/recipes/" in args[1]):
            found.append(f"{d.name}: {' '.join(args[:6])[:120]}")
    return found


def host_state() -> dict[str, Any]:
    """Load average and other project jobs running beside the benchmark."""
    return {"loadavg_1min": round(os.getloadavg()[0], 2), "other_jobs": len(foreign_jobs())}


def wait_idle(deadline: float) -> None:
    """Wait (until ``deadline``) while other project jobs use the CPU."""
    said = False
    while time.monotonic() < deadline and (jobs := foreign_jobs()):
        if not said:
            print(f"waiting for other jobs to finish: {jobs}", flush=True)
        said = True
        time.sleep(10)


# a run whose speed probe moved more than this from the trace's is re-traced and measured once more, and counted
# apart by bench.latency_fit if it still did; on an idle host the probe spans 2.09-2.68 ms (50 runs, 2026-12-04)
DRIFT = 1.20

PROBE_SHAPES = ((1, 64, 56, 56), (64, 64, 3, 3))  # one 3x3 convolution of a ResNet stage: ~0.23 GFLOP


def speed_probe_ms(reps: int = 21) -> float:
    """The host's compute speed now: median ms of one fixed 3x3 convolution on 1 thread (about 2.5 ms each, 21 times),
    taken with each compute trace and around each run of the sweep."""
    import torch

    from disco.timing import median_ms

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w = (torch.randn(s, generator=g) for s in PROBE_SHAPES)
    with torch.no_grad():
        ms = median_ms(lambda: torch.nn.functional.conv2d(x, w, padding=1), reps, warmup=1)
    torch.set_num_threads(threads)
    return ms


def drift(trace_ms: float | None, before_ms: float, after_ms: float) -> float:
    """How far the host's speed around a run moved from its speed when the run's compute was traced: the
    larger of the two probe ratios' distance from 1, as a ratio >= 1 (1.0 when the trace has no probe)."""
    if not trace_ms:
        return 1.0
    return max(max(t / trace_ms, trace_ms / t) for t in (before_ms, after_ms))

