"""Start N node processes on this machine (free port on 127.0.0.1) and collect the leader's report."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class LaunchError(RuntimeError):
    """A node failed or refused; ``codes`` are the exit codes, ``stderr`` the nodes' error output."""

    def __init__(self, msg: str, codes: list[int | None], stderr: list[str]) -> None:
        super().__init__(msg)
        self.codes, self.stderr = codes, stderr


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_command(d: str | Path, rank: int, nodes: int, port: int, opts: list[str]) -> list[str]:
    return [sys.executable, "-m", "disco.runtime.node", str(d), "--rank", str(rank), "--world-size", str(nodes),
            "--master-addr", "127.0.0.1", "--master-port", str(port), *opts]


def launch(d: str | Path, nodes: int, opts: list[str] | None = None, port: int | None = None,
           timeout: float = 600.0, grace: float | None = None, ranks: list[int] | None = None) -> dict[str, Any]:
    """Run the node program for ``nodes`` ranks (all, or only ``ranks``) and return the leader's report.

    When a node exits non-zero the others get ``grace`` seconds (default: their peer timeout
    + 5 s) to exit by themselves; any still running then is killed, so none is left behind.
    """
    opts = list(opts or [])
    port = free_port() if port is None else port
    ranks = list(range(nodes)) if ranks is None else ranks
    if grace is None:
        t = float(opts[opts.index("--timeout") + 1]) if "--timeout" in opts else 20.0
        grace = t + 5.0
    with tempfile.TemporaryDirectory(prefix="disco-run-") as tmp:
        result = Path(tmp) / "result.json"
        procs: dict[int, subprocess.Popen] = {}
        errs: dict[int, Any] = {}
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        for r in ranks:
            cmd = node_command(d, r, nodes, port, opts + (["--result", str(result)] if r == 0 else []))
            errs[r] = open(Path(tmp) / f"err{r}.txt", "w+")  # noqa: SIM115
            procs[r] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errs[r], env=env)
        deadline = time.monotonic() + timeout
        first_fail: float | None = None
        try:
            while True:
                codes = {r: p.poll() for r, p in procs.items()}
                if all(c is not None for c in codes.values()):
                    break
                if first_fail is None and any(c not in (None, 0) for c in codes.values()):
                    first_fail = time.monotonic()
                now = time.monotonic()
                if now > deadline or (first_fail is not None and now - first_fail > grace):
                    log.error("killing nodes still running after %s", "a failure" if first_fail else "the timeout")
                    break
                time.sleep(0.05)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
            for p in procs.values():
                p.wait()
        codes_l = [procs[r].returncode for r in ranks]
        stderr = []
        for r in ranks:
            errs[r].seek(0)
            stderr.append(errs[r].read())
            errs[r].close()
        if any(c != 0 for c in codes_l):
            lines = [ln for e in stderr for ln in e.splitlines() if ln.startswith("disco node")]
            raise LaunchError("; ".join(lines[-nodes:]) or f"nodes exited with codes {codes_l}", codes_l, stderr)
        if 0 not in ranks:
            return {}
        return json.loads(result.read_text())
