"""Fault injection: what `disco run` does when a node dies, freezes or refuses, and what it leaves behind.

    OMP_NUM_THREADS=1 python -m bench.faults                 # every case -> results/faults.json
    python -m bench.faults --cases stop_leader_run,edit_kept  # some cases, in this order
    python -m bench.faults --resume                           # run only the cases not yet in the JSON
    python -m recipes.pages                                   # -> the table in docs/faults.md

Each case runs the real command line (``disco run``, or node programs) on a 2-node ``cifar_resnet8`` export of
each engine and records the exit code, the seconds from the fault (or the start) to the exit, the one line printed,
and leftovers (node processes alive, files in the run's temporary folder). A case's ``per`` entry for an engine
replaces some of its fields or says why it does not apply there. The quick cases run in tests/test_faults.py.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DISCO = [sys.executable, "-m", "disco.cli"]
FAULT_ENV = "DISCO_FAULT"  # JSON {"rank", "at": startup|run|stream, "after", "signal": KILL|STOP}, read in the node
FAULT_LOG_ENV = "DISCO_FAULT_LOG"  # the node appends the fault's time here; the case times the exit from it
IGNORED = ("faults.log", ".ses")  # not leftovers: the fault log, onnxruntime's telemetry file (not the run's)


def install_node_hooks(register: Callable[[str, Callable[..., None]], None]) -> None:
    """Called by the node program: rank ``rank`` sends itself ``signal`` on joining (``at="startup"``), or before
    timed (``"run"``) or streamed (``"stream"``) inference ``after``."""
    spec = json.loads(os.environ.get(FAULT_ENV) or "{}")
    if not spec:
        return
    target, after, sig_name = int(spec["rank"]), int(spec.get("after", 1)), spec.get("signal", "KILL")
    point = {"startup": "startup", "run": "inference", "stream": "stream"}[spec.get("at", "run")]

    def hook(rank: int, k: int | None = None, i: int | None = None) -> None:
        if rank == target and (point == "startup" or (k if k is not None else i) == after):
            sig, now = signal.Signals["SIG" + sig_name.upper().removeprefix("SIG")], time.time()
            print(f"disco node {rank}: fault injection: {sig.name} at {now:.3f}", file=sys.stderr, flush=True)
            if os.environ.get(FAULT_LOG_ENV):
                with open(os.environ[FAULT_LOG_ENV], "a") as f:
                    f.write(f"{now:.3f}\n")
            os.kill(os.getpid(), sig)

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
    per: dict[str, dict[str, Any] | str] = field(default_factory=dict)  # engine -> field overrides, or why n/a
    engine: str = "torch"


def for_engine(c: Case, engine: str) -> Case | str:
    """Case ``c`` as run on ``engine`` (its overrides applied), or the reason it does not apply there."""
    v = c.per.get(engine, {})
    return v if isinstance(v, str) else replace(c, engine=engine, **v)


@dataclass
class Outcome:
    case: str
    engine: str
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
    not_applicable: str = ""  # why the case does not apply to this engine (then nothing ran)


def make_export(d: Path, seed: int = 0, engine: str = "torch", nodes: int = 2) -> Path:
    """cifar_resnet8 over ``nodes`` nodes, 30% of the links kept at random: a torch export, or an ONNX one."""
    import numpy as np
    import torch

    from disco.graph import partition
    from disco.masks import DiscoModel
    from disco.models import build_model
    from disco.runtime.export import export
    from disco.runtime.onnx_export import export_onnx

    torch.manual_seed(seed)
    model = build_model("cifar_resnet8").eval()
    part = partition(model, (1, 3, 32, 32), nodes)
    kept = np.random.default_rng(seed).random(part.n_links) < 0.3
    spec = {"name": "cifar_resnet8", "kwargs": {}}
    if engine == "onnx":
        export_onnx(model, part, kept, d, spec)
    else:
        export(DiscoModel(model, part, kept).eval(), part, kept, d, spec)
    return d


def _json(f: Path, fn: Callable[[dict], Any]) -> None:
    m = json.loads(f.read_text())
    fn(m)
    f.write_text(json.dumps(m))


def _manifest(d: Path, fn: Callable[[dict], Any]) -> None:
    _json(d / "manifest.json", fn)


def resealed(rel: str, fn: Callable[[Path], Any]) -> Callable[[Path], None]:
    """An edit of an ONNX export: ``fn(d / rel)``, then the manifest's sha256s and ``manifest_hash`` resealed."""
    def reseal(m: dict, d: Path) -> None:
        m["files"] = {k: hashlib.sha256((d / k).read_bytes()).hexdigest() for k in m.pop("files")}
        m.pop("manifest_hash")
        m["manifest_hash"] = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()[:32]
    return lambda d: (fn(d / rel), _manifest(d, lambda m: reseal(m, d)))


def onnx_edit(fn: Callable[[Any], Any]) -> Callable[[Path], None]:
    """An edit of one ONNX graph file: ``fn(its ModelProto)``."""
    def edit(p: Path) -> None:
        import onnx
        g = onnx.load(p)
        fn(g)
        onnx.save(g, p)
    return edit


def _scale(g: Any) -> None:  # the largest initializer x 1.5
    from onnx import numpy_helper
    w = max(g.graph.initializer, key=lambda t: len(t.raw_data))
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.5, w.name))


def sched_edit(rank: int, op: str, fn: Callable[[dict], Any], reseal: bool = False) -> Callable[[Path], None]:
    """An edit of rank ``rank``'s schedule: ``fn`` on its first step of op ``op`` (then the manifest resealed)."""
    rel = f"rank{rank}/schedule.json"

    def edit(f: Path) -> None:
        _json(f, lambda s: fn(next(st for st in s["steps"] if st["op"] == op)))
    return resealed(rel, edit) if reseal else lambda d: edit(d / rel)


def move_one_link(d: Path) -> None:
    import numpy as np

    from disco.checkpoint import pack_bits, unpack_bits

    def f(m: dict) -> None:
        kept = unpack_bits(m["kept"], m["n_links"])
        on, off = np.flatnonzero(kept)[0], np.flatnonzero(~kept)[0]
        kept[on], kept[off] = False, True
        m["kept"] = pack_bits(kept)

    _manifest(d, f)


def flip_byte(rel: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        raw = bytearray((d / rel).read_bytes())
        raw[-9] ^= 0xFF
        (d / rel).write_bytes(bytes(raw))
    return edit


def _copy(src: Path, dst: Path) -> None:
    _ = shutil.copytree(src, dst, dirs_exist_ok=True) if src.is_dir() else shutil.copy(src, dst)


def from_other_export(rel: str) -> Callable[[Path], None]:
    """Replace ``rel`` (a file or a rank folder) by its namesake in another export (seed 1) of the same engine."""
    def edit(d: Path) -> None:
        engine = "onnx" if (d / "rank0" / "schedule.json").is_file() else "torch"
        _copy(make_export(d.parent / (d.name + "-other"), seed=1, engine=engine) / rel, d / rel)
    return edit


def _set(key: str, value: object) -> Callable[[Path], None]:
    return lambda d: _manifest(d, lambda m: m.update({key: value}))


def _env(tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), **{FAULT_LOG_ENV: str(tmp / "faults.log")},
                **(extra or {}))


def _nodes_of(d: Path) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"(disco\\.runtime\\.node|disco_edge) {d}"], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def _leftovers(d: Path, tmp: Path) -> tuple[int, int]:
    time.sleep(0.5)
    procs = _nodes_of(d)
    for p in procs:  # clean up after a failed case, so the next one starts clean
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    files = [p for p in tmp.iterdir() if p.name not in IGNORED]
    return len(procs), len(files)


def _signal_when_computing(p: subprocess.Popen, d: Path, sig: int, t_fault: list[float]) -> None:
    """Send ``sig`` to `disco run` once its two nodes have run a few seconds (they are computing by then)."""
    while p.poll() is None and len(_nodes_of(d)) < 2:
        time.sleep(0.2)
    time.sleep(8.0)
    if p.poll() is None:
        t_fault.append(time.time())
        p.send_signal(sig)


def _run(cmds: list[list[str]], envs: list[dict[str, str]], timeout: float,
         watch: Callable[[subprocess.Popen], None] | None = None) -> tuple[list[int], list[list[tuple]], float]:
    """Run ``cmds`` at once (``watch``: a thread on the first), each killed ``timeout`` s after the one before
    ended: (exit codes, each one's non-blank stderr lines as (time read, line), end time)."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=e)
             for cmd, e in zip(cmds, envs, strict=True)]
    lines: list[list[tuple]] = [[] for _ in procs]

    def read(p: subprocess.Popen, out: list[tuple]) -> None:
        for ln in p.stderr:
            if ln.strip():
                out.append((time.time(), ln.rstrip("\n")))

    threads = [threading.Thread(target=read, args=a, daemon=True) for a in zip(procs, lines, strict=True)]
    threads += [threading.Thread(target=watch, args=(procs[0],), daemon=True)] if watch else []
    for t in threads:
        t.start()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    t_end = time.time()
    for t in threads[:len(procs)]:
        t.join(5)
    return [p.returncode for p in procs], lines, t_end


def run_cli_case(c: Case, d: Path, tmp: Path, timeout: float) -> Outcome:
    """Case ``c`` through ``disco run``."""
    cmd = DISCO + ["run", str(d), "--nodes", "2", "--warmup", "0", "--iters", "100000", "--timeout", f"{timeout:g}",
                   "--startup-timeout", "30", *c.args]
    t_start, t_fault = time.time(), []
    watch = None if c.signal_run is None else lambda p: _signal_when_computing(p, d, c.signal_run, t_fault)
    (code,), (out,), t_end = _run([cmd], [_env(tmp, c.fault)], 600, watch)
    lines = [x for x in out if "Warning" not in x[1]]
    logged = (tmp / "faults.log").read_text().split() if (tmp / "faults.log").is_file() else []  # the node's time
    t0 = t_fault[0] if t_fault else float(logged[0]) if logged else t_start
    procs, files = _leftovers(d, tmp)
    t_msg, msg = lines[-1] if lines else (t_end, "")
    ok = code == c.expect and procs == 0 and files == 0 and c.needs in msg
    return Outcome(c.name, c.engine, c.what, code, c.expect, round(t_msg - t0, 1), round(t_end - t0, 1),
                   msg, len(lines), procs, files, ok)


def _run_nodes(c: Case, d: Path, tmp: Path, port: int, tokens: dict[int, str]) -> Outcome:
    """Node programs as ``disco run`` starts them, rank r with run token ``tokens[r]``, the leader at ``port``."""
    from disco.runtime.launch import node_command

    opts, t0 = ["--startup-timeout", "5", "--iters", "1", "--warmup", "0"], time.time()
    codes, out, t_end = _run([node_command(d, r, 2, port, opts) for r in tokens],
                             [_env(tmp, {"DISCO_RUN_TOKEN": t}) for t in tokens.values()], 120)
    left, files = _leftovers(d, tmp)
    lines = [ln for o in out for _, ln in o if ln.startswith("disco node")]
    code = max(codes, key=lambda x: (x != 0, x))  # the case's code: the worst node's
    ok = code == c.expect and 0 not in codes and left == 0 and all(c.needs in ln for ln in lines[:1])
    return Outcome(c.name, c.engine, c.what, code, c.expect, round(t_end - t0, 1), round(t_end - t0, 1),
                   " | ".join(lines), len(lines), left, files, ok)


def _held_port(rank: int) -> Callable[[Case, Path, Path], Outcome]:
    """Node ``rank`` alone, its master port held by another program (it accepts, never answers)."""
    def run(c: Case, d: Path, tmp: Path) -> Outcome:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            return _run_nodes(c, d, tmp, s.getsockname()[1], {rank: "t"})
    return run


def wrong_token(c: Case, d: Path, tmp: Path) -> Outcome:
    """Two nodes of 'one run' that do not share the run's token: neither accepts the other."""
    from disco.runtime.launch import free_port

    return _run_nodes(c, d, tmp, free_port(), {0: "a", 1: "b"})


ONNX_ONLY = "a torch export has no ONNX graphs nor per-rank schedule"
MH = "'manifest_hash'"  # an ONNX export's manifest edits are caught by its hash


def cases() -> list[Case]:
    """Every case, with its ONNX-engine equivalent or the reason it has none (``per``)."""
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
    graph = "rank1/seg0.onnx"
    out += [
        Case("edit_kept", "manifest: one kept link moved", 2, edit=move_one_link, needs="field 'kept'",
             per={"onnx": dict(what="rank1/schedule.json: one send's tag edited", needs="schedule.json: sha256",
                               edit=sched_edit(1, "send", lambda st: st.update(tag=st["tag"] + 1)))}),
        Case("edit_shard_sha", "manifest: a shard's sha256 edited", 2,
             edit=lambda d: _manifest(d, lambda m: m["shards"][1].update(sha256="0" * 64)), needs="'shards'",
             per={"onnx": dict(what="manifest: a graph's sha256 edited", needs=MH,
                               edit=lambda d: _manifest(d, lambda m: m["files"].update({graph: "0" * 64})))}),
        Case("edit_manifest_hash", "manifest: manifest_hash edited", 2, edit=_set("manifest_hash", "0" * 32), needs=MH),
        Case("edit_codec", "manifest: codec edited", 2, edit=_set("codec", "int8"), needs="'codec'",
             per={"onnx": dict(needs=MH)}),
        Case("missing_key", "manifest: model_hash removed", 2,
             edit=lambda d: _manifest(d, lambda m: m.pop("model_hash")), needs="'model_hash' missing",
             per={"onnx": dict(what="manifest: manifest_hash removed", needs="'manifest_hash' missing",
                               edit=lambda d: _manifest(d, lambda m: m.pop("manifest_hash")))}),
        Case("weights_path", "manifest: model.kwargs.weights = /etc/passwd", 2, needs="model.kwargs.weights",
             edit=lambda d: _manifest(d, lambda m: m["model"]["kwargs"].update(weights="/etc/passwd")),
             per={"onnx": "an ONNX node builds no model: its weights are inside its graphs (case shard_file_path: "
                          "a graph outside the rank folder)"}),
        Case("shard_file_path", "manifest: shards[0].file = ../x", 2, needs="shards[0]",
             edit=lambda d: _manifest(d, lambda m: m["shards"][0].update(file="../x.safetensors")),
             per={"onnx": dict(what="rank1/schedule.json runs ../rank0/seg0.onnx (resealed)",
                               edit=sched_edit(1, "run", lambda st: st.update(graph="../rank0/" + st["graph"]), True),
                               needs="outside its folder")}),
        Case("shard_byte", "shard: one byte of node1 flipped", 2, edit=flip_byte("node1.safetensors"), needs="node1",
             per={"onnx": dict(what=f"{graph}: one byte flipped", edit=flip_byte(graph), needs="sha256 differs")}),
        Case("shard_other_export", "shard: node1 from another export", 2,
             edit=from_other_export("node1.safetensors"), needs="another model",
             per={"onnx": dict(what="rank1/ from another export", edit=from_other_export("rank1"),
                               needs="sha256 differs")}),
        Case("rank_swap", "rank0/ replaced by rank1/", 2, edit=lambda d: _copy(d / "rank1", d / "rank0"),
             needs="rank 1's folder", per={"torch": ONNX_ONLY}),
        Case("onnx_opset", f"{graph} at opset 99 (manifest resealed)", 2,
             edit=resealed(graph, onnx_edit(lambda g: g.opset_import[0].__setattr__("version", 99))),
             needs="cannot load it", per={"torch": ONNX_ONLY}),
        Case("recv_shape", "rank0/schedule.json: a recv's shape edited (resealed)", 3, needs="the schedule says",
             edit=sched_edit(0, "recv", lambda st: st["shape"].__setitem__(1, st["shape"][1] + 1), True),
             per={"torch": ONNX_ONLY}),
        Case("weights_resealed", f"{graph}: a weight scaled (resealed)", 3, edit=resealed(graph, onnx_edit(_scale)),
             needs="self-test", per={"torch": "a torch shard records its digests inside (case shard_byte)"}),
        Case("bad_codec", "option: --codec fp8", 2, ["--codec", "fp8"], needs="fp8"),
        Case("sigterm", "SIGTERM to disco run mid-run", 128 + signal.SIGTERM, signal_run=signal.SIGTERM,
             needs="SIGTERM"),
        Case("sigint", "SIGINT (Ctrl-C) to disco run mid-run", 128 + signal.SIGINT, signal_run=signal.SIGINT,
             needs="SIGINT"),
        Case("foreign_listener", "non-leader; master port held by another program", 3, custom=_held_port(1),
             needs="cannot reach the leader's store", per={"onnx": dict(needs="lost rank 0")}),
        Case("port_in_use", "leader; master port already in use", 3, custom=_held_port(0), needs="in use",
             per={"onnx": dict(expect=2)}),  # the onnxruntime engine refuses before compute (exit 2)
        Case("wrong_token", "two nodes with different run tokens", 3, custom=wrong_token, needs="not there",
             per={"onnx": dict(needs="another run token")}),
    ]
    return out


def run_case(c: Case, base: Path, timeout: float) -> Outcome:
    """Run case ``c`` (as :func:`for_engine` gives it) on a copy of the export ``base`` of its engine."""
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
    ap.add_argument("--engine", default="both", choices=("torch", "onnx", "both"))
    ap.add_argument("--timeout", type=float, default=10.0, help="--timeout of every run (s)")
    ap.add_argument("--out", default=str(ROOT / "results" / "faults.json"))
    ap.add_argument("--resume", action="store_true", help="keep the cases already in --out, run the others")
    args = ap.parse_args()
    engines = ("torch", "onnx") if args.engine == "both" else (args.engine,)
    todo = cases()
    if args.cases:
        want = args.cases.split(",")
        todo = sorted((c for c in todo if c.name in want), key=lambda c: want.index(c.name))
    out_path = Path(args.out)
    old = json.loads(out_path.read_text()) if args.resume and out_path.is_file() else {}
    results = [r for r in old.get("cases", []) if old.get("timeout_s") == args.timeout and "engine" in r]
    done = {(r["case"], r["engine"]) for r in results}
    order = {k: i for i, k in enumerate((c.name, e) for c in cases() for e in ("torch", "onnx"))}
    with tempfile.TemporaryDirectory(prefix="disco-faults-") as tmp:
        bases = {e: make_export(Path(tmp) / e, engine=e) for e in engines}
        for c, e in ((c, e) for c in todo for e in engines if (c.name, e) not in done):
            ce = for_engine(c, e)
            o = Outcome(c.name, e, c.what, None, c.expect, 0.0, 0.0, "", 0, 0, 0, True, ce) if isinstance(
                ce, str) else run_case(ce, bases[e], args.timeout)
            print(f"{'ok  ' if o.ok else 'FAIL'} {e} {o.case}: exit {o.exit_code}, message after {o.seconds} s "
                  f"(process gone after {o.seconds_to_exit} s), {o.leftover_processes} processes / "
                  f"{o.leftover_files} files left: {o.message or o.not_applicable}", flush=True)
            results.append(asdict(o))
            results.sort(key=lambda r: order.get((r["case"], r["engine"]), len(order)))  # by case, then engine
            out = {"timeout_s": args.timeout, "nodes": 2, "model": "cifar_resnet8", "engines": ["torch", "onnx"],
                   "command": f"python -m bench.faults --timeout {args.timeout:g}", "cases": results}
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(out, indent=1) + "\n")  # after every case: a long run can be resumed
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
