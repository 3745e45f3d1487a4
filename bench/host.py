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
    while time.monotonic() < deadline:
        jobs = foreign_jobs()
        if not jobs:
            return
        if not said:
            print(f"waiting for other jobs to finish: {jobs}", flush=True)
            said = True
        time.sleep(10)
