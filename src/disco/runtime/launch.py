"""Start N node processes on this machine (free port on 127.0.0.1) and collect the leader's report."""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import Interrupted, LaunchError
from .options import RunOptions, run_options
from .rendezvous import PARENT_ENV, TOKEN_ENV

log = logging.getLogger(__name__)

GRACE_S = 2.0  # after a node fails, the others get this long to exit by themselves (they are told in < 1 s)


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_onnx_export(d: str | Path) -> bool:
    """Whether ``d`` is an ONNX export (``rank0/schedule.json``), run by the torch-free engine ``disco_edge``."""
    return (Path(d) / "rank0" / "schedule.json").is_file()


def node_command(d: str | Path, rank: int, nodes: int, port: int, opts: RunOptions | list[str] | None = None,
                 result: str | Path | None = None, leader: str = "127.0.0.1", host: str | None = None
                 ) -> list[str]:
    """The node program's command line for ``rank``: ``python -m disco.runtime.node``, or for an ONNX export
    ``python -m disco_edge`` (the same run options; rank 0's address ``leader`` is the rendezvous; ``host``:
    this node's own address, where it is not 127.0.0.1)."""
    if is_onnx_export(d):
        cmd = [sys.executable, "-m", "disco_edge", str(d), "--rank", str(rank), "--nodes", str(nodes),
               "--leader", f"{leader}:{port}", *(["--host", host] if host else []), *run_options(opts).to_argv()]
        return cmd + (["--result", str(result)] if result is not None else [])
    cmd = [sys.executable, "-m", "disco.runtime.node", str(d), "--rank", str(rank), "--world-size", str(nodes),
           "--master-addr", leader, "--master-port", str(port), *run_options(opts).to_argv()]
    return cmd + (["--result", str(result)] if result is not None else [])


_PREFIX = re.compile(r"^disco node \S+: error: ")


def node_reason(stderr: str, code: int | None) -> str:
    """The reason a node gave for stopping: its ``disco node k: error:`` line, else its last line that
    says error, else its last line, else how it ended."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if _PREFIX.match(ln):
            return _PREFIX.sub("", ln)
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln
    if lines:
        return lines[-1]
    return f"exited with code {code}"


def failure_message(order: list[int], codes: dict[int, int | None], stderr: dict[int, str],
                    killed: dict[int, str]) -> str:
    """One line: the first failing node's reason first, each reason once (an echo of an earlier one is left out)."""
    seen: list[str] = []
    parts: list[str] = []
    ranks = order + sorted(r for r in codes if r not in order and codes[r] not in (0, None) and r not in killed)
    for r in ranks:
        why = node_reason(stderr[r], codes[r])
        if any(s in why for s in seen):
            continue
        seen.append(re.sub(r"^stopping: rank \d+ reported: ", "", why))
        parts.append(why if re.match(rf"ranks? ({r}\b|[\d, ]*\b{r}\b)", why) else f"rank {r}: {why}")
    parts += [f"rank {r} ({how}) was ended by the launcher" for r, how in sorted(killed.items())]
    return "; ".join(parts) or f"nodes exited with codes {[codes[r] for r in sorted(codes)]}"


class _Signals:
    """While a launch runs in the main thread, SIGTERM (and SIGINT) raise :class:`Interrupted`."""

    def __enter__(self) -> _Signals:
        self.old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self.old[s] = signal.signal(s, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    def __exit__(self, *exc: Any) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


def _state(pid: int) -> str:
    """The process state letter from /proc (``T``: stopped), or ``?``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _stop(procs: dict[int, subprocess.Popen], polite: bool) -> dict[int, str]:
    """End every node still running; return ``{rank: how it was found}`` for those it ended.

    ``polite``: SIGTERM first, SIGKILL a second later (an interrupted launch); else SIGKILL at once
    (after a failure the others already had their grace; a stopped process ignores SIGTERM anyway)."""
    live = {r: ("stopped" if _state(p.pid) == "T" else "running") for r, p in procs.items() if p.poll() is None}
    for r in live:
        if polite:
            procs[r].terminate()
        else:
            procs[r].kill()
    t_end = time.monotonic() + 1.0
    for r in live:
        try:
            procs[r].wait(max(0.0, t_end - time.monotonic()))
        except subprocess.TimeoutExpired:
            procs[r].kill()
    for p in procs.values():
        p.wait()
    return live


def _report_progress(f: Path, progress: Callable[[int, int], None]) -> None:
    try:
        done, total = (int(v) for v in f.read_text().split())
    except (OSError, ValueError):  # being replaced
        return
    progress(done, total)


def _end_lost(first: int, procs: dict[int, subprocess.Popen], errs: dict[int, Any], killed: dict[int, str]) -> None:
    """The first failing node named a lost rank: end that one at once (stopped or hung, it cannot recover)."""
    errs[first].flush()
    errs[first].seek(0)
    m = re.search(r"lost rank (\d+)", node_reason(errs[first].read(), procs[first].returncode))
    errs[first].seek(0, 2)
    r = int(m.group(1)) if m else None
    if r is not None and r in procs and procs[r].poll() is None:
        killed[r] = "stopped" if _state(procs[r].pid) == "T" else "running"
        procs[r].kill()


def launch(d: str | Path, nodes: int, opts: RunOptions | list[str] | None = None, port: int | None = None,
           timeout: float = 600.0, grace: float | None = None, ranks: list[int] | None = None,
           progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the node program for ``nodes`` ranks (all, or only ``ranks``) and return the leader's report.

    When a node exits non-zero the others get ``grace`` seconds (default 2 s: they learn of it through
    the store within a heartbeat) to exit by themselves; any still running then (a stopped one) is
    ended, so none is left behind. SIGTERM or SIGINT end the nodes and raise :class:`Interrupted`.
    Raises :class:`LaunchError` naming the first failing node's reason. ``progress(done, total)`` is
    called while the leader runs a test split (``data``).
    """
    o = run_options(opts)
    o.check()
    port = free_port() if port is None else port
    ranks = list(range(nodes)) if ranks is None else ranks
    grace = GRACE_S if grace is None else grace
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               **{TOKEN_ENV: secrets.token_hex(16), PARENT_ENV: str(os.getpid())})
    with tempfile.TemporaryDirectory(prefix="disco-run-") as tmp, _Signals():
        result = Path(tmp) / "result.json"
        prog_file = Path(tmp) / "progress"
        procs: dict[int, subprocess.Popen] = {}
        errs: dict[int, Any] = {}
        order: list[int] = []
        killed: dict[int, str] = {}
        interrupted = False
        try:
            for r in ranks:
                errs[r] = open(Path(tmp) / f"err{r}.txt", "w+")  # noqa: SIM115
                cmd = node_command(d, r, nodes, port, o, result if r == 0 else None)
                # own session: a terminal's Ctrl-C reaches the launcher only, which ends the nodes itself
                renv = dict(env, DISCO_PROGRESS=str(prog_file)) if r == 0 and progress is not None else env
                procs[r] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errs[r], env=renv,
                                            start_new_session=True)
            deadline = time.monotonic() + timeout
            first_fail: float | None = None
            while True:
                codes = {r: p.poll() for r, p in procs.items()}
                order += [r for r, c in codes.items() if c not in (None, 0) and r not in order and r not in killed]
                if all(c is not None for c in codes.values()):
                    break
                if first_fail is None and order:
                    first_fail = time.monotonic()
                    _end_lost(order[0], procs, errs, killed)
                now = time.monotonic()
                if now > deadline or (first_fail is not None and now - first_fail > grace):
                    log.info("ending nodes still running after %s", "a failure" if first_fail else "the timeout")
                    break
                if progress is not None and prog_file.is_file():
                    _report_progress(prog_file, progress)
                time.sleep(0.05)
        except KeyboardInterrupt:
            interrupted = True
            raise Interrupted(signal.SIGINT) from None
        except Interrupted:
            interrupted = True
            raise
        finally:
            killed.update(_stop(procs, polite=interrupted))
            for f in errs.values():
                f.flush()
        codes_d = {r: procs[r].returncode for r in ranks}
        if progress is not None and prog_file.is_file():  # the last state, also when the split ran between polls
            _report_progress(prog_file, progress)
        stderr: dict[int, str] = {}
        for r in ranks:
            errs[r].seek(0)
            stderr[r] = errs[r].read()
            errs[r].close()
        codes_l = [codes_d[r] for r in ranks]
        if killed and not order:
            raise LaunchError(f"the run did not finish within {timeout:.0f} s; nodes {sorted(killed)} were ended",
                              codes_l, [stderr[r] for r in ranks])
        if any(c != 0 for c in codes_l):
            raise LaunchError(failure_message(order, codes_d, stderr, killed), codes_l, [stderr[r] for r in ranks])
        if 0 not in ranks:
            return {}
        return json.loads(result.read_text())
