"""A served group for the tests: the hand-built 2-rank export (tests/edge_export.py) as real processes on
127.0.0.1, and its one-process model (numpy) to check every answer against."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from tests import edge_export

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def toy_model(x: np.ndarray) -> np.ndarray:
    """The function the toy export computes (edge_export.build): relu(x * c0) + x * c1."""
    rng = np.random.default_rng(0)
    c0, c1 = (rng.standard_normal([1, 4, 1, 1]).astype(np.float32) for _ in range(2))
    return np.maximum(x * c0, 0) + x * c1


def http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None, method: str | None = None,
         timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; an HTTP error status is returned, not raised."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class Group:
    """``disco-node`` ranks of an export on 127.0.0.1; rank 0 serves on ``self.url``."""

    def __init__(self, export: Path, nodes: int = 2, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.export, self.nodes = export, nodes
        self.leader = f"127.0.0.1:{free_port()}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = extra or []
        self.env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
        self.procs: dict[int, subprocess.Popen] = {}

    def cmd(self, rank: int) -> list[str]:
        c = [sys.executable, "-m", "disco_edge", str(self.export), "--rank", str(rank), "--nodes", str(self.nodes),
             "--leader", self.leader, "--timeout", "10"]
        return c + (["--serve", f"127.0.0.1:{self.port}", *self.extra] if rank == 0 else [])

    def start(self, rank: int) -> subprocess.Popen:
        p = subprocess.Popen(self.cmd(rank), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        self.procs[rank] = p
        return p

    def __enter__(self) -> Group:
        for r in range(self.nodes):
            self.start(r)
        self.wait_ready()
        return self

    def wait_ready(self, ready: bool = True, limit_s: float = 60.0) -> float:
        """Seconds until /v2/health/ready says ``ready`` (bounded)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            try:
                code, _, _ = http(self.url + "/v2/health/ready", timeout=5)
                if (code == 200) == ready:
                    return time.monotonic() - t0
            except OSError:
                pass
            dead = {r: p.returncode for r, p in self.procs.items() if p.poll() is not None and r == 0}
            if dead:
                raise AssertionError(f"rank 0 ended: {dead}, stderr {self.procs[0].stderr.read()[-2000:]}")
            time.sleep(0.1)
        raise AssertionError(f"not {'ready' if ready else 'unready'} within {limit_s} s")

    def stop(self) -> dict[int, Any]:
        """SIGTERM rank 0, then the others end by themselves; returns each rank's (exit code, stderr)."""
        out = {}
        if self.procs.get(0) is not None and self.procs[0].poll() is None:
            self.procs[0].send_signal(signal.SIGTERM)
        for r, p in self.procs.items():
            try:
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            out[r] = (p.returncode, err)
        return out

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def infer_json(self, x: np.ndarray, rid: str = "", model: str | None = None,
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                            "data": x.reshape(-1).tolist()}]}
        if rid:
            body["id"] = rid
        code, _, raw = http(f"{self.url}/v2/models/{model or self.export.name}/infer", json.dumps(body).encode(),
                            {"Content-Type": "application/json", **(headers or {})})
        return code, json.loads(raw)


def build(tmp: Path, name: str = "toy") -> Path:
    d = tmp / name
    edge_export.build(d)
    return d
