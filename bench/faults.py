"""Fault injection: what `disco run` does when a node dies, freezes or refuses, and what it leaves behind.

    OMP_NUM_THREADS=1 python -m bench.faults                 # every case -> results/faults.json
    python -m bench.faults --cases stop_leader_run,edit_kept  # some cases, in this order
    python -m bench.faults --resume                           # run only the cases not yet in the JSON
    python -m recipes.pages                                   # -> the table in docs/faults.md

Each case runs the real command line (``disco run``, or the node program for the rendezvous cases) on a
``cifar_resnet8`` export split over 2 nodes, and records the exit code, the seconds from the fault to the
exit (from the start for refusals), the one line the command printed, and leftovers: node processes still
alive and files left in the run's temporary folder. The quick cases also run in the test suite
(tests/test_faults.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISCO = [sys.executable, "-m", "disco.cli"]
FAULT_ENV = "DISCO_FAULT"  # JSON {"rank", "at": startup|run|stream, "after", "signal": KILL|STOP}, read in the node
FAULT_LOG_ENV = "DISCO_FAULT_LOG"  # the node appends the fault's time here; the case times the exit from it


# ---- the node side: a hook the node program imports only when DISCO_NODE_HOOKS names this file -------------

def _send_fault(rank: int, sig_name: str) -> None:
    """This process sends itself SIGKILL or SIGSTOP, saying when on stderr (and in the fault log)."""
    sig = signal.Signals["SIG" + sig_name.upper().removeprefix("SIG")]
    now = time.time()
    print(f"disco node {rank}: fault injection: {sig.name} at {now:.3f}", file=sys.stderr, flush=True)
    if os.environ.get(FAULT_LOG_ENV):
        with open(os.environ[FAULT_LOG_ENV], "a") as f:
            f.write(f"{now:.3f}\n")
    os.kill(os.getpid(), sig)


def install_node_hooks(register: Callable[[str, Callable[..., None]], None]) -> None:
    """Called by the node program (``disco.runtime.hooks``): rank ``rank`` sends itself ``signal`` right after
    joining the store (``at="startup"``), before timed inference ``after`` (``"run"``) or before streamed
    inference ``after`` (``"stream"``)."""
    spec = json.loads(os.environ.get(FAULT_ENV) or "{}")
    if not spec:
        return
    target, after, sig = int(spec["rank"]), int(spec.get("after", 1)), spec.get("signal", "KILL")
    point = {"startup": "startup", "run": "inference", "stream": "stream"}[spec.get("at", "run")]

    def hook(rank: int, k: int | None = None, i: int | None = None) -> None:
        if rank == target and (point == "startup" or (k if k is not None else i) == after):
            _send_fault(rank, sig)

    register(point, hook)


def fault_env(rank: int, at: str = "run", after: int = 1, sig: str = "KILL") -> dict[str, str]:
    """The environment that makes rank ``rank`` of a run fail as :func:`install_node_hooks` describes."""
    return {"DISCO_NODE_HOOKS": str(Path(__file__).resolve()),
            FAULT_ENV: json.dumps({"rank": rank, "at": at, "after": after, "signal": sig})}


@dataclass
class Case:
    name: str
    what: str  # the table's description
    expect: int  # the exit code the case must give
    args: list[str] = field(default_factory=list)  # extra `disco run` options
    fault: dict[str, str] = field(default_factory=dict)  # environment of an injected fault (fault_env)
    edit: Callable[[Path], None] | None = None  # damages the export copy
    signal_run: int | None = None  # sent to `disco run` once its nodes compute
    custom: Callable[[Path, float], dict] | None = None  # runs node programs itself
    needs: str = ""  # a substring the message must hold


@dataclass
class Outcome:
    case: str
    what: str
    exit_code: int | None
    expected: int
    seconds: float  # from the fault (or the start, for refusals) to the one-line message
    seconds_to_exit: float  # ... to the process exit (adds the interpreter's teardown: slow on a loaded machine)
    message: str
    stderr_lines: int
    leftover_processes: int
    leftover_files: int
    ok: bool


# ---- exports and edits ----------------------------------------------------------------------------------

def make_export(d: Path, seed: int = 0) -> Path:
    import numpy as np
    import torch

    from disco.graph import partition
    from disco.masks import DiscoModel
    from disco.models import build_model
    from disco.runtime.export import export

    torch.manual_seed(seed)
    model = build_model("cifar_resnet8").eval()
    part = partition(model, (1, 3, 32, 32), 2)
    kept = np.random.default_rng(seed).random(part.n_links) < 0.3
    export(DiscoModel(model, part, kept).eval(), part, kept, d, {"name": "cifar_resnet8", "kwargs": {}})
    return d


def _manifest(d: Path, fn: Callable[[dict], None]) -> None:
    m = json.loads((d / "manifest.json").read_text())
    fn(m)
    (d / "manifest.json").write_text(json.dumps(m))


def move_one_link(d: Path) -> None:
    import numpy as np

    from disco.checkpoint import pack_bits, unpack_bits

    def f(m: dict) -> None:
        kept = unpack_bits(m["kept"], m["n_links"])
        on, off = np.flatnonzero(kept)[0], np.flatnonzero(~kept)[0]
        kept[on], kept[off] = False, True
        m["kept"] = pack_bits(kept)

    _manifest(d, f)


def flip_shard_byte(d: Path) -> None:
    raw = bytearray((d / "node1.safetensors").read_bytes())
    raw[-9] ^= 0xFF
    (d / "node1.safetensors").write_bytes(bytes(raw))


def swap_in_other_shard(d: Path) -> None:
    other = make_export(d.parent / (d.name + "-other"), seed=1)
    shutil.copy(other / "node1.safetensors", d / "node1.safetensors")


def _set(key: str, value: object) -> Callable[[Path], None]:
    return lambda d: _manifest(d, lambda m: m.update({key: value}))


# ---- running one case -------------------------------------------------------------------------------------

def _env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), **{FAULT_LOG_ENV: str(tmp / "faults.log")},
                **(extra or {}))


def _fault_time(tmp: Path) -> float | None:
    f = tmp / "faults.log"
    if not f.is_file():
        return None
    lines = f.read_text().split()
    return float(lines[0]) if lines else None


def _nodes_of(d: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"disco.runtime.node {d}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _leftovers(d: Path, tmp: Path) -> tuple[int, int]:
    time.sleep(0.5)
    procs = _nodes_of(d)
    for p in procs:  # clean up after a failed case, so the next one starts clean
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    files = [p for p in tmp.iterdir() if p.name != "faults.log"]
    return len(procs), len(files)


def _signal_when_computing(p: subprocess.Popen, d: Path, sig: int, t_fault: list[float]) -> None:
    """Send ``sig`` to `disco run` once its two nodes have run a few seconds (they are computing by then)."""
    while p.poll() is None and len(_nodes_of(d)) < 2:
        time.sleep(0.2)
    time.sleep(8.0)
    if p.poll() is None:
        t_fault.append(time.time())
        p.send_signal(sig)


def run_cli_case(c: Case, d: Path, tmp: Path, timeout: float) -> Outcome:
    cmd = DISCO + ["run", str(d), "--nodes", "2", "--warmup", "0", "--iters", "100000", "--timeout", f"{timeout:g}",
                   "--startup-timeout", "30", *c.args]
    t_start = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(tmp, c.fault))
    t_fault: list[float] = []
    if c.signal_run is not None:
        threading.Thread(target=_signal_when_computing, args=(p, d, c.signal_run, t_fault), daemon=True).start()
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for ln in p.stderr:
            if ln.strip() and "Warning" not in ln:
                lines.append((time.time(), ln.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        p.wait(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    t_end = time.time()
    reader.join(5)
    t0 = t_fault[0] if t_fault else (_fault_time(tmp) or t_start)
    procs, files = _leftovers(d, tmp)
    t_msg, msg = lines[-1] if lines else (t_end, "")
    ok = p.returncode == c.expect and procs == 0 and files == 0 and c.needs in msg
    return Outcome(c.name, c.what, p.returncode, c.expect, round(t_msg - t0, 1), round(t_end - t0, 1), msg,
                   len(lines), procs, files, ok)


def _node(d: Path, rank: int, port: int, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "disco.runtime.node", str(d), "--rank", str(rank), "--world-size", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--startup-timeout", "5", "--iters", "1",
            "--warmup", "0", *(extra or [])]


def _run_nodes(c: Case, d: Path, tmp: Path, cmds: list[list[str]], envs: list[dict[str, str]]) -> Outcome:
    t0 = time.time()
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=e)
             for cmd, e in zip(cmds, envs, strict=True)]
    errs, codes = [], []
    for p in procs:
        try:
            errs.append(p.communicate(timeout=120)[1])
        except subprocess.TimeoutExpired:
            p.kill()
            errs.append(p.communicate()[1])
        codes.append(p.returncode)
    t_end = time.time()
    left, files = _leftovers(d, tmp)
    lines = [ln for e in errs for ln in e.splitlines() if ln.startswith("disco node")]
    code = max(codes, key=lambda x: (x != 0, x))  # the case's code: the worst node's
    ok = all(x == c.expect for x in codes) and left == 0 and all(c.needs in ln for ln in lines[:1])
    return Outcome(c.name, c.what, code, c.expect, round(t_end - t0, 1), round(t_end - t0, 1), " | ".join(lines),
                   len(lines), left, files, ok)


def _held_port(rank: int) -> Callable[[Case, Path, Path], Outcome]:
    """Node ``rank`` alone, its master port held by another program (it accepts, never answers)."""
    def run(c: Case, d: Path, tmp: Path) -> Outcome:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            return _run_nodes(c, d, tmp, [_node(d, rank, s.getsockname()[1])], [_env(tmp, {"DISCO_RUN_TOKEN": "t"})])
    return run


def wrong_token(c: Case, d: Path, tmp: Path) -> Outcome:
    """Two nodes of 'one run' that do not share the run's token: neither accepts the other."""
    from disco.runtime.launch import free_port

    port = free_port()
    return _run_nodes(c, d, tmp, [_node(d, 0, port), _node(d, 1, port)],
                      [_env(tmp, {"DISCO_RUN_TOKEN": "a"}), _env(tmp, {"DISCO_RUN_TOKEN": "b"})])


def cases() -> list[Case]:
    out = []
    for who, rank in (("leader", 0), ("non-leader", 1)):
        lost = f"lost rank {rank}"
        for sig in ("KILL", "STOP"):
            tag = f"{sig.lower()}_{'leader' if rank == 0 else 'peer'}"
            out.append(Case(f"{tag}_startup", f"SIG{sig} of the {who} at start-up", 3,
                            fault=fault_env(rank, "startup", sig=sig), needs=f"rank {rank}"))
            out.append(Case(f"{tag}_run", f"SIG{sig} of the {who} after 5 inferences", 3,
                            fault=fault_env(rank, "run", 5, sig), needs=lost))
            out.append(Case(f"{tag}_stream", f"SIG{sig} of the {who} mid-stream (--stream 8)", 3,
                            ["--iters", "60", "--stream", "8"], fault=fault_env(rank, "stream", 20, sig), needs=lost))
    out += [
        Case("edit_kept", "manifest: one kept link moved", 2, edit=move_one_link, needs="field 'kept'"),
        Case("edit_shard_sha", "manifest: a shard's sha256 edited", 2,
             edit=lambda d: _manifest(d, lambda m: m["shards"][1].update(sha256="0" * 64)), needs="'shards'"),
        Case("edit_manifest_hash", "manifest: manifest_hash edited", 2, edit=_set("manifest_hash", "0" * 32),
             needs="'manifest_hash'"),
        Case("edit_codec", "manifest: codec edited", 2, edit=_set("codec", "int8"), needs="'codec'"),
        Case("missing_key", "manifest: model_hash removed", 2,
             edit=lambda d: _manifest(d, lambda m: m.pop("model_hash")), needs="'model_hash' missing"),
        Case("weights_path", "manifest: model.kwargs.weights = /etc/passwd", 2,
             edit=lambda d: _manifest(d, lambda m: m["model"]["kwargs"].update(weights="/etc/passwd")),
             needs="model.kwargs.weights"),
        Case("shard_file_path", "manifest: shards[0].file = ../x", 2,
             edit=lambda d: _manifest(d, lambda m: m["shards"][0].update(file="../x.safetensors")),
             needs="shards[0]"),
        Case("shard_byte", "shard: one byte of node1 flipped", 2, edit=flip_shard_byte, needs="node1"),
        Case("shard_other_export", "shard: node1 from another export", 2, edit=swap_in_other_shard,
             needs="another model"),
        Case("bad_codec", "option: --codec fp8", 2, ["--codec", "fp8"], needs="fp8"),
        Case("sigterm", "SIGTERM to disco run mid-run", 128 + signal.SIGTERM, signal_run=signal.SIGTERM,
             needs="SIGTERM"),
        Case("sigint", "SIGINT (Ctrl-C) to disco run mid-run", 128 + signal.SIGINT, signal_run=signal.SIGINT,
             needs="SIGINT"),
        Case("foreign_listener", "non-leader; master port held by another program", 3, custom=_held_port(1),
             needs="cannot reach the leader's store"),
        Case("port_in_use", "leader; master port already in use", 3, custom=_held_port(0), needs="in use"),
        Case("wrong_token", "two nodes with different run tokens", 3, custom=wrong_token, needs="not there"),
    ]
    return out


def run_case(c: Case, base: Path, timeout: float) -> Outcome:
    """Run case ``c`` on a copy of the export ``base`` (in its own temporary folder)."""
    with tempfile.TemporaryDirectory(prefix=f"disco-fault-{c.name}-") as root:
        d, tmp = Path(root) / "export", Path(root) / "tmp"
        shutil.copytree(base, d)
        tmp.mkdir()
        if c.edit is not None:
            c.edit(d)
        if c.custom is not None:
            return c.custom(c, d, tmp)
        return run_cli_case(c, d, tmp, timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--timeout", type=float, default=10.0, help="--timeout of every run (s)")
    ap.add_argument("--out", default=str(ROOT / "results" / "faults.json"))
    ap.add_argument("--resume", action="store_true", help="keep the cases already in --out, run the others")
    args = ap.parse_args()
    todo = cases()
    if args.cases:
        want = args.cases.split(",")
        todo = sorted((c for c in todo if c.name in want), key=lambda c: want.index(c.name))
    out_path = Path(args.out)
    old = json.loads(out_path.read_text()) if args.resume and out_path.is_file() else {}
    results = [r for r in old.get("cases", []) if old.get("timeout_s") == args.timeout]
    todo = [c for c in todo if c.name not in {r["case"] for r in results}]
    with tempfile.TemporaryDirectory(prefix="disco-faults-") as tmp:
        base = make_export(Path(tmp) / "base")
        for c in todo:
            o = run_case(c, base, args.timeout)
            print(f"{'ok  ' if o.ok else 'FAIL'} {o.case}: exit {o.exit_code}, message after {o.seconds} s "
                  f"(process gone after {o.seconds_to_exit} s), "
                  f"{o.leftover_processes} processes / {o.leftover_files} files left: {o.message}", flush=True)
            results.append(asdict(o))
            out = {"timeout_s": args.timeout, "nodes": 2, "model": "cifar_resnet8",
                   "command": f"python -m bench.faults --timeout {args.timeout:g}", "cases": results}
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(out, indent=1) + "\n")  # after every case: a long run can be resumed
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
