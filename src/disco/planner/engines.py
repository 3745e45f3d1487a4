"""The node engine a plan prices: ``torch`` (the calibration as fitted) or ``onnx`` (disco_edge, timed here).

``onnx``: the ONNX engine's costs are measured on this host at plan time, in the spirit of ``--time-host``:

- compute (:func:`ort_costs`): one ONNX Runtime session (the node engine's own options, one thread) runs a
  one-op graph (the fixed cost of a session run: ``run_s``, paid per compute segment), a chain of small
  convolutions and the model exported to ONNX; the fixed cost of an op ``op_s`` and the cost of a FLOP
  ``flop_s`` fit those two (with the compute model's FLOPs and ops of the dense model). A rank of an ONNX export
  runs each compute segment as one graph, so it pays ``run_s`` once per segment and no Python per op. The
  dense model in one graph fuses what a split's segments cannot, so the three are then scaled by
  ``split_factor`` (:func:`split_compute`: a real 2-node ONNX split's ranks timed alone over what their compute
  predicts; resnet50 at 224 px 1.4x, CIFAR ResNet-20 2.3-2.6x on the 2-core development host);
- messages (:func:`message_costs`): a one-way ping-pong of the engine's own ZeroMQ transport between two processes
  (``python -m disco_edge.pingpong``, a small and a large message, without and with the pacing thread holding
  each message for an emulated latency, and with both processes computing between messages): the CPU a process
  spends per message ``msg_s`` and per byte ``byte_s`` (half a round trip's CPU of every thread of rank 0: its
  send, its receive and the ZeroMQ I/O thread's work, at the two sizes), the delivery delay ``a + b * bytes`` the
  rest of the
  one-way time (the receiver's wake-up and receive are inside it: no receive overhead or wake-up is added; paced:
  less the emulated latency), ``busy_s`` what computing on both sides adds to it, ``corun`` how much the two
  processes' computing slows each other (the host's other load included, as it is now);
- the codecs scale as ``--time-host`` scales them (the dense model's ONNX Runtime time over
  the calibration's one-process time); ``oversub`` and ``wake_oversub_s`` stay the calibration's.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import subprocess
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import RefusedError
from ..timing import median_ms
from .calibration import Calibration
from .host import scaled_to_host

log = logging.getLogger(__name__)
ENGINES = ("torch", "onnx")
PINGPONG_SIZES = (1024, 262144)
CHAIN = 64  # small convolutions in the chain that prices one op
CONV_FLOPS = 2 * 8 * 8 * 9 * 16  # FLOPs of one of them (the compute model's 2 x MACs)
SPLIT_RATIO = 0.2  # the split whose ranks are timed to correct the per-FLOP cost (split_compute)
NEEDS = {"onnxruntime": "onnxruntime", "zmq": "pyzmq", "onnx": "onnx"}  # module -> the package that installs it


def require_onnx_engine() -> None:
    """Refuse (one line naming the fix) when onnxruntime, pyzmq or onnx is not installed here."""
    missing = [pkg for mod, pkg in NEEDS.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise RefusedError(f"--engine onnx times the ONNX engine on this host and needs {' and '.join(missing)}: "
                           f"pip install {' '.join(missing)}, or plan --engine torch")


def _timed_session(path: Path, shape: tuple[int, ...], reps: int) -> float:
    """Median seconds of one run of the ONNX graph at ``path`` in the node engine's session (one input)."""
    import numpy as np

    from disco_edge.engine import session

    sess = session(path)
    feeds = {sess.get_inputs()[0].name: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}
    return median_ms(lambda: sess.run(None, feeds), reps, warmup=1) / 1e3


def _chain(path: Path, ops: int, conv: bool) -> tuple[int, ...]:
    """An ONNX graph of ``ops`` ops in a row: small 3x3 convolutions (8 channels, 4x4: ``CONV_FLOPS`` each), or
    Relu on 16 values; returns its input shape."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    names = ["x"] + [f"y{i}" for i in range(ops)]
    shape = (1, 8, 4, 4) if conv else (1, 16)
    w = [numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8, 3, 3), dtype=np.float32), "w")]
    nodes = [helper.make_node("Conv", [a, "w"], [b], pads=[1, 1, 1, 1]) if conv else helper.make_node("Relu", [a], [b])
             for a, b in zip(names, names[1:], strict=False)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, shape)],
                          initializer=w if conv else [])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return shape


def ort_costs(model: Any, shape: tuple[int, ...], flops: float, ops: float, reps: int = 20) -> dict[str, float]:
    """ONNX Runtime on this host, one thread: ``run_s`` (a one-Relu graph's run), the cost of each further op of a
    chain of small convolutions (``op_s`` + ``CONV_FLOPS`` x ``flop_s``), and ``model`` exported to ONNX
    (``one_process_ms`` = ``run_s`` + ``ops`` x ``op_s`` + ``flops`` x ``flop_s``: its FLOPs and ops in the compute
    model); ``op_s`` and ``flop_s`` solve those two equations."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        p = {k: Path(d) / f"{k}.onnx" for k in ("dense", "relu", "conv1", "convs")}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(shape),), str(p["dense"]), dynamo=False, opset_version=17)
        run_s = _timed_session(p["relu"], _chain(p["relu"], 1, False), 10 * reps)
        conv = [_timed_session(p[k], _chain(p[k], n, True), 10 * reps) for k, n in (("conv1", 1), ("convs", CHAIN))]
        whole = _timed_session(p["dense"], shape, reps)
    per_op = max(0.0, (conv[1] - conv[0]) / (CHAIN - 1))
    rest = flops - ops * CONV_FLOPS
    flop_s = max(0.0, (whole - run_s - ops * per_op) / rest) if rest > 0 else 0.0
    return {"run_s": run_s, "op_s": max(0.0, per_op - CONV_FLOPS * flop_s), "flop_s": flop_s,
            "one_process_ms": whole * 1e3}


def split_compute(model: Any, shape: tuple[int, ...], cal: Calibration, r: float = SPLIT_RATIO,
                  reps: int = 10) -> dict[str, Any]:
    """The ONNX engine's compute of a real split on this host against the compute model's: ``model`` exported
    over 2 nodes at ``r`` (one-shot magnitude links, as ``disco export --format onnx``), each rank's segments run
    alone (``disco_edge.transport.NoLink``) by the node engine, against :func:`price`'s compute of the same
    programs with ``cal``.
    ONNX Runtime's per-FLOP cost comes from the dense model in one graph, which fuses what a rank's segments
    cannot, so a split computes slower than its FLOPs say; ``split_factor`` (the slower rank, measured over
    modelled) carries that to every candidate."""
    import copy

    from disco_edge.bundle import load
    from disco_edge.codecs import get_codec
    from disco_edge.engine import Engine
    from disco_edge.transport import NoLink

    from ..graph import partition
    from ..masks import DiscoModel
    from ..runtime.latency import compute_s
    from ..runtime.onnx_export import export_onnx
    from ..sparsify import magnitude_scores, select_links
    from .pricing import price
    from .programs import programs

    part = partition(model, shape, 2)
    kept = select_links(part, magnitude_scores(DiscoModel(copy.deepcopy(model), part)), r, "global")
    alone = replace(cal, msg_s=0.0, byte_s=0.0)  # the ranks run without sending: compute only on both sides
    modelled = [compute_s(p) for p in price(programs(part, kept, "fp32"), alone)]
    measured = []
    with tempfile.TemporaryDirectory() as d:
        try:
            export_onnx(model, part, kept, d, {"name": "plan", "kwargs": {}})
        except (RefusedError, NotImplementedError) as e:  # e.g. a constant output: priced by its FLOPs
            log.warning("the split's compute is priced by its FLOPs only: %s", e)
            return {"split_factor": 1.0, "split_ratio": r, "split_refused": str(e)}
        for rank in range(2):
            b = load(d, rank, 2, verify=False)
            eng, x = Engine(b, NoLink(), get_codec("fp32")), (b.reference() or [None])[0]
            measured.append(median_ms(lambda eng=eng, x=x: eng.infer(x), reps, warmup=2) / 1e3)
    slow = max(range(2), key=lambda j: measured[j])
    return {"split_factor": measured[slow] / max(modelled[slow], 1e-12), "split_ratio": r,
            "split_node_ms": [round(t * 1e3, 3) for t in measured],
            "split_node_modelled_ms": [round(t * 1e3, 3) for t in modelled]}


@functools.lru_cache(maxsize=1)
def zmq_pingpong(iters: int = 100) -> dict[str, list[dict[str, Any]]]:
    """The engine transport's one-way ping-pong on this host, unpaced, paced and busy (``disco_edge.pingpong`` in a
    child process, so that its two node processes start without torch); measured once per process."""
    cmd = [sys.executable, "-m", "disco_edge.pingpong", "--sizes", ",".join(map(str, PINGPONG_SIZES)),
           "--iters", str(iters), "--modes", "unpaced,paced,busy"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the ZeroMQ ping-pong on this host failed (exit {p.returncode}): {tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def message_costs(pingpong: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Calibration fields from a ping-pong: ``msg_s`` and ``byte_s`` (a process's CPU per message and per byte,
    every thread's, from the unpaced rows' ``cpu_s``; without it ``msg_s`` is the send call's CPU and ``byte_s`` is
    left to the caller), per mode the delivery delay
    ``a + b * bytes`` fitted through the smallest and largest message (one-way time less the send call and the
    emulated latency the pacer held it for),
    ``busy_s`` (the small message's one-way time with both sides computing, less without) and ``corun`` (the
    work's time alone over its time while the other process works too)."""
    out: dict[str, float] = {}
    for mode, (a, b) in (("unpaced", ("delay_a", "delay_b")), ("paced", ("delay_paced_a", "delay_paced_b"))):
        rows = sorted(pingpong[mode], key=lambda r: r["bytes"])
        lo, hi = rows[0], rows[-1]
        d_lo, d_hi = (r["one_way_s"] - r["send_s"] - r.get("link_s", 0.0) for r in (lo, hi))
        slope = max(0.0, (d_hi - d_lo) / (hi["bytes"] - lo["bytes"])) if hi["bytes"] > lo["bytes"] else 0.0
        out[a], out[b] = max(0.0, d_lo - slope * lo["bytes"]), slope
    small, large = (f(pingpong["unpaced"], key=lambda r: r["bytes"]) for f in (min, max))
    out["msg_s"] = small["send_s"]
    if "cpu_s" in small:  # the process's CPU per message, its I/O thread's included (the send call is a part)
        out["msg_s"] = small["cpu_s"]
        if large["bytes"] > small["bytes"]:
            out["byte_s"] = max(0.0, (large["cpu_s"] - small["cpu_s"]) / (large["bytes"] - small["bytes"]))
    if "busy" in pingpong:
        busy = min(pingpong["busy"], key=lambda r: r["bytes"])
        out["busy_s"] = max(0.0, busy["one_way_s"] - small["one_way_s"])
        if busy.get("work_together_s", 0) > 0:
            out["corun"] = min(1.0, busy["work_alone_s"] / busy["work_together_s"])
    return out


def onnx_calibration(cal: Calibration, model: Any, name: str, shape: tuple[int, ...],
                     ort: dict[str, float] | None = None, pingpong: dict[str, Any] | None = None,
                     split: dict[str, Any] | None = None) -> tuple[Calibration, dict[str, Any]]:
    """``cal`` priced for the ONNX engine on this host (see the module's docstring): ``ort``
    (:func:`ort_costs`), ``pingpong`` (:func:`zmq_pingpong`) and ``split`` (:func:`split_compute`: the compute
    costs scaled by its ``split_factor``) are measured when not given. Returns the calibration and what was
    measured (the plan's ``host``)."""
    from ..graph import partition
    from .pricing import features
    from .programs import programs

    require_onnx_engine()
    if ort is None:
        part = partition(model, shape, 1)
        dense = features(programs(part, part.all_links(), "fp32"))[0]
        ort = ort_costs(model, shape, float(dense[0]), float(dense[1]))
    pp = zmq_pingpong() if pingpong is None else pingpong
    scaled, host = scaled_to_host(cal, model, name, shape, measured_ms=ort["one_process_ms"])
    msg = message_costs(pp)
    new = replace(scaled, **msg, flop_s=ort["flop_s"], op_s=ort["op_s"], run_s=ort["run_s"],
                  overhead_unshaped_s=0.0, overhead_paced_s=0.0, overhead_unshaped_byte_s=0.0,
                  overhead_paced_byte_s=0.0, wake_unshaped_s=0.0, wake_paced_s=0.0,
                  single_process_source="onnxruntime, 1 thread, timed on this host",
                  source=f"{cal.source}, ONNX engine timed on this host")
    sp = split_compute(model, shape, new) if split is None else split
    f = sp["split_factor"]
    new = replace(new, flop_s=new.flop_s * f, op_s=new.op_s * f, run_s=new.run_s * f)
    small = {m: min(pp[m], key=lambda r: r["bytes"]) for m in ("unpaced", "paced")}
    host.update(engine="onnx",  # paced: beyond the emulated latency
                zmq_one_way_ms={m: round((r["one_way_s"] - r.get("link_s", 0.0)) * 1e3, 4) for m, r in small.items()},
                zmq_message_bytes=small["unpaced"]["bytes"],
                costs={k: float(f"{getattr(new, k):.4g}") for k in (*msg, "run_s", "op_s", "flop_s")},  # as priced
                split=sp)
    return new, host
