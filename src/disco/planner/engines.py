"""The node engine a plan prices: ``torch`` (the calibration as fitted) or ``onnx`` (disco_edge, timed here).

``onnx``: the ONNX engine's costs are measured on this host at plan time, in the spirit of ``--time-host``:

- compute (:func:`ort_costs`): one ONNX Runtime session (the node engine's own options, one thread) runs a
  one-op graph (the fixed cost of a session run: ``run_s``, paid per compute segment), a chain of tiny ops (the
  cost of each further op: ``op_s``) and the model exported to ONNX (what its FLOPs cost beyond those:
  ``flop_s``, over the compute model's FLOPs and ops of the dense model). A rank of an ONNX export runs each
  compute segment as one graph, so it pays ``run_s`` once per segment and no Python per op;
- messages (:func:`message_costs`): a one-way ping-pong of the engine's own ZeroMQ transport between two processes
  (``python -m disco_edge.pingpong``, a small and a large message, without and with the pacing thread holding
  each message for an emulated latency, and with both processes computing between messages): the sender's CPU
  per message ``msg_s`` is its ``send`` call's CPU time, the delivery delay ``a + b * bytes`` the rest of the
  one-way time (the receiver's wake-up and receive are inside it: no receive overhead or wake-up is added; paced:
  less the emulated latency), ``busy_s`` what computing on both sides adds to it, ``corun`` how much the two
  processes' computing slows each other (the host's other load included, as it is now);
- the per-byte CPU and the codecs scale as ``--time-host`` scales them (the dense model's ONNX Runtime time over
  the calibration's one-process time); ``oversub`` and ``wake_oversub_s`` stay the calibration's.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import RefusedError
from .calibration import Calibration
from .host import scaled_to_host

ENGINES = ("torch", "onnx")
PINGPONG_SIZES = (1024, 262144)
CHAIN = 64  # tiny ops in the chain that prices one op
NEEDS = {"onnxruntime": "onnxruntime", "zmq": "pyzmq", "onnx": "onnx"}  # module -> the package that installs it


def require_onnx_engine() -> None:
    """Refuse (one line naming the fix) when onnxruntime, pyzmq or onnx is not installed here."""
    missing = [pkg for mod, pkg in NEEDS.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise RefusedError(f"--engine onnx times the ONNX engine on this host and needs {' and '.join(missing)}: "
                           f"pip install {' '.join(missing)}, or plan --engine torch")


def _median_s(fn: Callable[[], Any], reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _timed_session(path: Path, shape: tuple[int, ...], reps: int) -> float:
    """Median seconds of one run of the ONNX graph at ``path`` in the node engine's session (one input)."""
    import numpy as np

    from disco_edge.engine import session

    sess = session(path)
    feeds = {sess.get_inputs()[0].name: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)}
    return _median_s(lambda: sess.run(None, feeds), reps)


def _chain(path: Path, ops: int) -> None:
    """An ONNX graph of ``ops`` Relu ops in a row on 16 values."""
    from onnx import TensorProto, helper, save

    names = ["x"] + [f"y{i}" for i in range(ops)]
    nodes = [helper.make_node("Relu", [a], [b]) for a, b in zip(names, names[1:], strict=False)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, [1, 16])])
    save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def ort_costs(model: Any, shape: tuple[int, ...], flops: float, ops: float, reps: int = 20) -> dict[str, float]:
    """ONNX Runtime on this host, one thread: ``run_s`` (a one-op graph's run), ``op_s`` (each further op of a
    chain of tiny ops), ``one_process_ms`` (``model`` exported to ONNX) and ``flop_s`` (its time beyond one run
    and ``ops`` ops, over its ``flops``: the dense model's FLOPs and ops in the compute model)."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        dense, one, chain = Path(d) / "dense.onnx", Path(d) / "one.onnx", Path(d) / "chain.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(shape),), str(dense), dynamo=False, opset_version=17)
        _chain(one, 1)
        _chain(chain, CHAIN)
        run_s = _timed_session(one, (1, 16), 10 * reps)
        op_s = max(0.0, (_timed_session(chain, (1, 16), 10 * reps) - run_s) / (CHAIN - 1))
        whole = _timed_session(dense, shape, reps)
    flop_s = max(0.0, whole - run_s - ops * op_s) / flops if flops > 0 else 0.0
    return {"run_s": run_s, "op_s": op_s, "flop_s": flop_s, "one_process_ms": whole * 1e3}


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
    """Calibration fields from a ping-pong: ``msg_s`` (the unpaced send call's CPU), per mode the delivery delay
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
    small = min(pingpong["unpaced"], key=lambda r: r["bytes"])
    out["msg_s"] = small["send_s"]
    if "busy" in pingpong:
        busy = min(pingpong["busy"], key=lambda r: r["bytes"])
        out["busy_s"] = max(0.0, busy["one_way_s"] - small["one_way_s"])
        if busy.get("work_together_s", 0) > 0:
            out["corun"] = min(1.0, busy["work_alone_s"] / busy["work_together_s"])
    return out


def onnx_calibration(cal: Calibration, model: Any, name: str, shape: tuple[int, ...],
                     ort: dict[str, float] | None = None, pingpong: dict[str, Any] | None = None
                     ) -> tuple[Calibration, dict[str, Any]]:
    """``cal`` priced for the ONNX engine on this host (see the module's docstring): ``ort``
    (:func:`ort_costs`) and ``pingpong`` (:func:`zmq_pingpong`) are measured when not given. Returns the
    calibration and what was measured (the plan's ``host``)."""
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
    small = {m: min(pp[m], key=lambda r: r["bytes"]) for m in ("unpaced", "paced")}
    host.update(engine="onnx",  # paced: beyond the emulated latency
                zmq_one_way_ms={m: round((r["one_way_s"] - r.get("link_s", 0.0)) * 1e3, 4) for m, r in small.items()},
                zmq_message_bytes=small["unpaced"]["bytes"],
                costs={k: float(f"{v:.4g}") for k, v in {**msg, **ort}.items() if k != "one_process_ms"})
    return new, host
