"""``disco export --format onnx``: each rank's compute segments as ONNX graphs, its schedule, and a proof.

Layout (see ENGINE.md)::

    manifest.json          format, model, nodes, input shape, ratio, codec, predicted bytes, the sha256 of
                           every file below, the proof's error, and ``manifest_hash`` over all of these
    rankR/schedule.json    rank R's steps: runs of its ONNX segments, sends and receives of env values
    rankR/segK.onnx        the compute between two message blocks, the rank's weights inside
    rank0/reference.npz    the probe input and the model's own output on it

How: the N torch executors run the probe once (threads of this process) with an environment that records
which step reads and writes each value; every maximal block of runs of a rank's schedule (with the cuts of
the sends after it) becomes one segment whose inputs are the values it reads from before and whose outputs
are the values read after it. Each segment is traced by ``torch.onnx.export``. Then the N ranks run the ONNX
graphs in onnxruntime (:mod:`disco.edge.simulate`, no torch) and the export is refused above
:data:`~disco.runtime.export.PROOF_TOLERANCE` against the model's own forward.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, fx, nn

from ..errors import RefusedError
from ..graph import Partition
from ..schedule import Message, RankSchedule, Run, build, env_key
from .executor import Executor
from .export import PROOF_TOLERANCE, _masked, compare_reference, reference_outputs
from .plan import RankPlan
from .proof import SPREAD_THRESHOLD, output_spread
from .transport import LocalHub, ThreadTransport

log = logging.getLogger(__name__)

FORMAT = "disco-onnx"
VERSION = 1
OPSET = 17
MSG = -2  # the unit of message steps in the access record


class _Tracked(dict):
    """An executor environment that records, per key, the unit (segment or MSG) that wrote it and read it."""

    def __init__(self, init: dict[str, Any]) -> None:
        super().__init__(init)
        self.unit = -1
        self.writer = dict.fromkeys(init, -1)
        self.reads: list[tuple[int, str, int]] = []  # (reading unit, key, its writer then)
        self.values: dict[str, Any] = dict(init)

    def _read(self, k: str) -> None:
        if dict.__contains__(self, k):
            self.reads.append((self.unit, k, self.writer[k]))

    def __getitem__(self, k: str) -> Any:
        self._read(k)
        return super().__getitem__(k)

    def get(self, k: str, default: Any = None) -> Any:
        self._read(k)
        return super().get(k, default)

    def pop(self, k: str, *default: Any) -> Any:
        self._read(k)
        return super().pop(k, *default)

    def __setitem__(self, k: str, v: Any) -> None:
        self.writer[k] = self.unit
        self.values[k] = v
        super().__setitem__(k, v)

    def update(self, other: Any = (), **kw: Any) -> None:
        for k, v in dict(other, **kw).items():
            self[k] = v


def units(steps: list[Any]) -> list[int]:
    """Per step: the segment it belongs to (maximal blocks of runs, numbered from 0), or MSG."""
    out, seg, prev_run = [], -1, False
    for st in steps:
        is_run = isinstance(st, Run)
        seg += is_run and not prev_run
        out.append(seg if is_run else MSG)
        prev_run = is_run
    return out


class _TracingExecutor(Executor):
    def step(self, i: int) -> None:  # noqa: D102
        self._env.unit = self.unit_of[i]
        super().step(i)


def _trace_run(part: Partition, kept: np.ndarray, probe: Tensor) -> list[_TracingExecutor]:
    """Run the N executors on ``probe`` with recording environments; returns them (their ``_env``)."""
    hub, execs, errors = LocalHub(), [], []
    for j, sch in enumerate(build(part, kept)):
        plan = RankPlan(part, kept, j, sch)
        tr = ThreadTransport(hub, j, part.nodes, timeout=600.0, cdims={e.tag: e.cdim for e in plan.exchanges.values()})
        ex = _TracingExecutor(plan, part.gm, plan.shard_from(part.gm)[0], tr)
        ex.unit_of, ex.env_factory = units(sch.steps), _Tracked
        execs.append(ex)
    if any(-1 in ex.cuts for ex in execs):
        raise NotImplementedError("a send before any compute needs a cut (not supported by the ONNX export)")

    def work(j: int) -> None:
        try:
            execs[j].run([probe] if j == 0 else None)
        except BaseException as e:  # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(j,), daemon=True) for j in range(part.nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return execs


class _Segment(nn.Module):
    """The runs of one segment of one rank, as a module of its input values (traced by torch.onnx.export)."""

    def __init__(self, ex: Executor, steps: list[int], ins: list[str], outs: list[str], consts: dict) -> None:
        super().__init__()
        self.ex, self.steps, self.ins, self.outs, self.consts = ex, steps, ins, outs, consts

    def forward(self, *xs: Tensor) -> tuple[Tensor, ...]:
        env = dict(self.consts)
        env.update(zip(self.ins, xs, strict=True))
        self.ex._env, self.ex._freed = env, 1 << 30  # no frees inside a segment
        for i in self.steps:
            Executor.step(self.ex, i)  # the plain step: no recording
        return tuple(env[k] for k in self.outs)


def _segments(ex: _TracingExecutor) -> list[dict[str, Any]]:
    """Per segment of ``ex``'s schedule: its steps, input and output keys, example inputs and constants."""
    env: _Tracked = ex._env
    n_seg = max(ex.unit_of, default=-1) + 1
    final = {f"{o}@full" for o in ex.plan.outputs} if ex.plan.rank == 0 else set()
    out = []
    for s in range(n_seg):
        read_in = sorted({k for u, k, w in env.reads if u == s and w != s})
        written = {k for k, w in env.writer.items() if w == s}
        read_later = {k for u, k, w in env.reads if u != s and w == s}
        outs = sorted(k for k in (written & read_later) | (written & final) if isinstance(env.values[k], Tensor))
        ins = [k for k in read_in if isinstance(env.values[k], Tensor)]
        out.append({"steps": [i for i, u in enumerate(ex.unit_of) if u == s], "ins": ins, "outs": outs,
                    "example": tuple(env.values[k] for k in ins),
                    "consts": {k: env.values[k] for k in read_in if k not in ins}})
    return out


def _export_rank(ex: _TracingExecutor, folder: Path) -> dict[str, Any]:
    """Write rank ``ex.plan.rank``'s segments and schedule.json into ``folder``."""
    folder.mkdir(parents=True)
    sch, rank = ex.plan.schedule, ex.plan.rank
    segs = _segments(ex)
    runs = {}
    for k, seg in enumerate(segs):
        if not seg["outs"]:
            continue
        name = f"seg{k}.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings: the python branches are fixed per rank
            torch.onnx.export(_Segment(ex, seg["steps"], seg["ins"], seg["outs"], seg["consts"]), seg["example"],
                              str(folder / name), input_names=seg["ins"], output_names=seg["outs"],
                              opset_version=OPSET, dynamo=False, do_constant_folding=True)
        runs[seg["steps"][0]] = {"op": "run", "graph": name, "inputs": seg["ins"], "outputs": seg["outs"]}
    steps = []
    for i, st in enumerate(sch.steps):
        if i in runs:
            steps.append(runs[i])
        elif isinstance(st, Message):
            steps.append({**st.to_json(), "value": env_key(st, rank), "tensor": st.value})
    steps = with_frees(steps, {p["name"] for p in doc_outputs(sch, rank)})
    doc = {"format": "disco-onnx-schedule/1", "rank": rank, "nodes": sch.nodes,
           "inputs": [p.to_json() for p in sch.inputs] if rank == 0 else [],
           "outputs": doc_outputs(sch, rank),
           "steps": steps}
    (folder / "schedule.json").write_text(json.dumps(doc, separators=(",", ":")))
    return doc


def doc_outputs(sch: RankSchedule, rank: int) -> list[dict[str, Any]]:
    """The model outputs on the leader after its last step (``name@full``); none elsewhere."""
    return [{**p.to_json(), "name": f"{p.name}@full"} for p in sch.outputs] if rank == 0 else []


def with_frees(steps: list[dict[str, Any]], keep: set[str]) -> list[dict[str, Any]]:
    """``steps`` with a ``free`` step after the last reader of each value (but the outputs ``keep``)."""
    last: dict[str, int] = {}
    for i, st in enumerate(steps):
        for v in st["inputs"] if st["op"] == "run" else [st["value"]] if st["op"] == "send" else []:
            last[v] = i
    frees: dict[int, list[str]] = {}
    for v, i in last.items():
        if v not in keep:
            frees.setdefault(i, []).append(v)
    out = []
    for i, st in enumerate(steps):
        out.append(st)
        if i in frees:
            out.append({"op": "free", "values": sorted(frees[i])})
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_onnx(model: nn.Module, part: Partition, kept: np.ndarray | None, out_dir: str | Path,
                model_spec: dict[str, Any], codec: str = "fp32", probe: Tensor | None = None,
                info: dict[str, Any] | None = None, tol: float = PROOF_TOLERANCE) -> dict[str, Any]:
    """Write the ONNX export of ``model`` split by ``part`` with links ``kept`` to ``out_dir``, after proving
    it in onnxruntime against the model's own forward (refused above ``tol``). Returns the manifest."""
    from ..cost import estimate
    from ..edge.simulate import simulate

    kept = part.all_links() if kept is None else np.asarray(kept, dtype=bool)
    if probe is None:
        probe = torch.randn(part.input_shape, generator=torch.Generator().manual_seed(0))
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with _masked(model, part, kept) as m, torch.no_grad():
        ref = reference_outputs(m(probe))
        out_spread = output_spread(m, probe, ref)
    if out_spread < SPREAD_THRESHOLD:  # its output proves nothing, and this proof compares outputs only
        raise RefusedError(f"refusing the ONNX export: the model's output does not depend on its input (spread "
                           f"{out_spread:.1e} between two probes: a zero-initialised head?), so the ONNX graphs "
                           "cannot be proved on it; export --format torch (its proof compares the last "
                           "non-constant tensors) or load trained weights")
    execs = _trace_run(part, kept, probe)
    for ex in execs:
        _export_rank(ex, tmp / f"rank{ex.plan.rank}")
    in_name = execs[0].plan.inputs[0]
    got, counters = simulate(tmp, {in_name: probe.numpy()})
    full = fx.node.map_arg(execs[0].plan.output_node.args[0], lambda a: torch.from_numpy(got[f"{a.name}@full"]))
    err = compare_reference(full, ref)
    if err > tol:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RefusedError(f"refusing to export: the ONNX split differs from the model's own forward on the probe "
                           f"input (max rel. error {err:.2e} > {tol:g})")
    np.savez(tmp / "rank0" / "reference.npz", input=probe.numpy(), **{k: v.numpy() for k, v in ref.items()})
    rep = estimate(part, kept)
    files = {str(p.relative_to(tmp)): _sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    man = {"format": FORMAT, "version": VERSION, "model": model_spec, "nodes": part.nodes,
           "shares": list(part.shares) if part.shares else None, "input_shape": list(part.input_shape),
           "input": in_name, "ratio": part.ratio(kept), "codec": codec, "bytes_predicted": rep.bytes,
           "messages_per_inference": rep.messages_per_inference, "link_values_scheduled": counters["link_values"],
           "max_rel_err_onnx": err, "files": files, "info": info or {},
           "preprocess": (info or {}).get("preprocess"),  # size, mean, std, scale, labels: what a client feeds
           "shape_guards": list(part.shape_guards)}  # branches on the input's shape resolved for input_shape
    man["manifest_hash"] = hashlib.sha256(json.dumps(man, sort_keys=True).encode()).hexdigest()[:32]
    (tmp / "manifest.json").write_text(json.dumps(man, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    log.info("ONNX export of %d ranks in %s: max rel. error %.2e in onnxruntime", part.nodes, out, err)
    return man


