"""Kernel link shaping for the benchmark: two network namespaces joined by a veth pair, tbf on each end.

Needs root (CAP_NET_ADMIN) and iproute2. Node r runs in namespace ``NS[r]``; gloo is bound to the veth
(``GLOO_SOCKET_IFNAME``); the runtime does no pacing. The namespaces are deleted after every run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from disco.runtime.launch import LaunchError, free_port, node_command

NS = ["disco_bench0", "disco_bench1"]
VETH = ["dbv0", "dbv1"]


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


def netns_cleanup() -> None:
    for ns in NS:
        _sh("ip", "netns", "del", ns, check=False)
    _sh("ip", "link", "del", VETH[0], check=False)


def tbf_burst(bw_mbit: float) -> int:
    """The tbf bucket in bytes at ``bw_mbit``: 1 ms of traffic, at least 16 KB (the tc prediction takes it too)."""
    return int(max(16 * 1024, bw_mbit * 1e6 / 8 / 1000))


def netns_setup(bw_mbit: float) -> None:
    """The namespaces and the veth, tbf at ``bw_mbit`` with a bucket of ``tbf_burst`` bytes."""
    netns_cleanup()
    for ns in NS:
        _sh("ip", "netns", "add", ns)
    _sh("ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
    for r in (0, 1):
        ns, dev = NS[r], VETH[r]
        _sh("ip", "link", "set", dev, "netns", ns)
        _sh("ip", "-n", ns, "addr", "add", f"10.77.0.{r + 1}/24", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0", check=False)
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{bw_mbit:g}mbit",
            "burst", str(tbf_burst(bw_mbit)), "latency", "2s")


def netns_check() -> str | None:
    """None when namespaces and tc work here, else why not."""
    if os.geteuid() != 0:
        return "not root: network namespaces and tc need CAP_NET_ADMIN"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    try:
        netns_setup(100)
    except subprocess.CalledProcessError as e:
        return f"{' '.join(e.cmd)} failed: {e.stderr.strip()}"
    finally:
        netns_cleanup()
    return None


def launch_tc(d: Path, bw_mbit: float, opts: list[str], timeout: float) -> dict[str, Any]:
    """N=2, node r in namespace NS[r], the veth shaped by tbf; the leader's report. ``d``: a torch or ONNX export."""
    port = free_port()
    procs: list[subprocess.Popen] = []
    errs: list[Any] = []  # each node's stderr file, closed whatever happens
    try:
        netns_setup(bw_mbit)
        with tempfile.TemporaryDirectory(prefix="disco-tc-") as tmp:
            res = Path(tmp) / "result.json"
            for r in (0, 1):  # either engine: the torch node or, for an ONNX export, disco_edge
                cmd = ["ip", "netns", "exec", NS[r], "env", f"GLOO_SOCKET_IFNAME={VETH[r]}", "OMP_NUM_THREADS=1",
                       *node_command(d, r, 2, port, opts, res if r == 0 else None, "10.77.0.1", f"10.77.0.{r + 1}")]
                errs.append(open(Path(tmp) / f"err{r}.txt", "w+"))  # noqa: SIM115
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errs[-1]))
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.1)
            codes = [p.poll() for p in procs]
            if any(c != 0 for c in codes):
                text = [Path(e.name).read_text()[-600:] for e in errs]
                raise LaunchError(f"tc run failed, exit codes {codes}: {' | '.join(text)}", codes, text)
            return json.loads(res.read_text())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for e in errs:
            e.close()
        netns_cleanup()
