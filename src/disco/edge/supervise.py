"""``disco serve``: a served group of an ONNX export as N local ``disco-node`` processes, kept up.

Rank 0 serves the Open Inference Protocol on ``host:port``; the others follow it. A non-leader that ends is
started again with the same command (same rank, export and run token) after a backoff that doubles while it
keeps failing (1 s, 2 s, ... 30 s; back to 1 s once it has run for a minute); it rejoins the running group.
Rank 0's end ends the group: every rank is stopped and the whole group started again, with the same backoff.
SIGINT / SIGTERM stop rank 0 (which ends the others) and leave no process behind.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("disco.notice")
TOKEN_ENV = "DISCO_RUN_TOKEN"
PARENT_ENV = "DISCO_LAUNCHER_PID"
BACKOFF_S = (1.0, 30.0)  # first and largest wait before a restart
STABLE_S = 60.0  # a process that ran this long starts again after the first wait
POLL_S = 0.2
STOP_S = 15.0  # after SIGTERM, rank 0 gets this long to end the group; then every rank left is killed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    backoff: float = BACKOFF_S[0]
    due: float = 0.0  # when a restart is due (monotonic), 0: running
    restarts: int = 0
    codes: list[int] = field(default_factory=list)


class Supervisor:
    """Start, watch and restart the ranks of ``export``; :meth:`run` returns when a signal stops it."""

    def __init__(self, export: str | Path, nodes: int, port: int, host: str = "127.0.0.1",
                 node_args: list[str] | None = None, serve_args: list[str] | None = None,
                 leader_port: int | None = None) -> None:
        self.export, self.nodes = Path(export), nodes
        self.serve_addr = f"{host}:{port}"
        self.leader = f"127.0.0.1:{leader_port or _free_port()}"
        self.node_args, self.serve_args = node_args or [], serve_args or []
        self.env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                        **{TOKEN_ENV: os.environ.get(TOKEN_ENV) or secrets.token_hex(16), PARENT_ENV: str(os.getpid())})
        self.ranks = [_Rank(r) for r in range(nodes)]
        self._signal: int | None = None

    def command(self, rank: int) -> list[str]:
        """The ``disco-node`` command of ``rank`` (the one a device would run, see docs/serving.md)."""
        cmd = [sys.executable, "-m", "disco_edge", str(self.export), "--rank", str(rank), "--nodes", str(self.nodes),
               "--leader", self.leader, *self.node_args]
        return cmd + (["--serve", self.serve_addr, *self.serve_args] if rank == 0 else [])

    def _start(self, r: _Rank) -> None:
        r.proc = subprocess.Popen(self.command(r.rank), env=self.env, stdout=subprocess.DEVNULL,
                                  start_new_session=True)  # a terminal's Ctrl-C reaches the supervisor only
        r.started, r.due = time.monotonic(), 0.0
        log.info("rank %d started (pid %d)", r.rank, r.proc.pid)

    def _ended(self, r: _Rank, code: int) -> None:
        now = time.monotonic()
        if now - r.started >= STABLE_S:
            r.backoff = BACKOFF_S[0]
        r.codes.append(code)
        r.due = now + r.backoff
        log.warning("rank %d ended (exit %s); restarting it in %.0f s", r.rank, code, r.backoff)
        r.backoff = min(BACKOFF_S[1], r.backoff * 2)
        r.restarts += 1
        r.proc = None

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM; returns 0 after a clean stop."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for r in self.ranks:
                self._start(r)
            while self._signal is None:
                self._watch()
                time.sleep(POLL_S)
            log.info("stopping the group (signal %d)", self._signal)
        finally:
            self.stop()
            for s, h in old.items():
                signal.signal(s, h)
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signal = signum

    def _watch(self) -> None:
        now = time.monotonic()
        leader = self.ranks[0]
        if leader.proc is not None and leader.proc.poll() is not None:  # the leader's end ends the group
            self._ended(leader, leader.proc.returncode)
            for r in self.ranks[1:]:
                self._kill(r)
                r.due = leader.due
        for r in self.ranks:
            if r.proc is not None and r.proc.poll() is not None:
                self._ended(r, r.proc.returncode)
            elif r.proc is None and r.due and now >= r.due and (r.rank == 0 or self.ranks[0].proc is not None):
                self._start(r)

    def _kill(self, r: _Rank) -> None:
        if r.proc is not None and r.proc.poll() is None:
            r.proc.kill()
            r.proc.wait()
        r.proc = None

    def stop(self) -> None:
        """SIGTERM rank 0 (it tells the others to end), wait, then kill whatever is left."""
        lead = self.ranks[0].proc
        if lead is not None and lead.poll() is None:
            lead.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for r in self.ranks:
            if r.proc is None:
                continue
            try:
                r.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("rank %d did not end within %.0f s: killed", r.rank, STOP_S)
                self._kill(r)
