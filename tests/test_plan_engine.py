"""``disco plan --engine onnx``: the ONNX engine priced from its compute and per-message costs timed on this host."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from disco import planner
from disco.cli import main
from disco.graph import partition
from disco.models import build_model
from disco.planner import engines

SHAPE = (1, 3, 32, 32)
ORT = {"run_s": 2e-5, "op_s": 1e-6, "flop_s": 5e-12, "one_process_ms": 5.0}
SPLIT = {"split_factor": 1.0}  # a split computing as its FLOPs say


def _pingpong(one_way_s: float, send_s: float = 1e-5) -> dict:
    """A ping-pong result: ``one_way_s`` for 1 KB, plus 1 ns per byte, the same paced and unpaced."""
    rows = [{"bytes": 1024, "one_way_s": one_way_s, "send_s": send_s},
            {"bytes": 263168, "one_way_s": one_way_s + 262144e-9, "send_s": send_s}]
    return {"unpaced": rows, "paced": rows}


def test_onnx_calibration_takes_the_measured_costs() -> None:
    """Compute from ONNX Runtime's timings, messages from the ping-pong (receive overheads and wake-ups inside
    its one-way time), per-byte CPU and codecs scaled as --time-host does, host sharing kept (busy_s measured when
    the ping-pong has its busy mode)."""
    model = build_model("cifar_resnet8").eval()
    cal = planner.Calibration(single_process={"cifar_resnet8|1,3,32,32": 10.0}, codec_encode_s={"int8": 1e-9})
    new, host = planner.onnx_calibration(cal, model, "cifar_resnet8", SHAPE, ort=ORT, pingpong=_pingpong(1e-4),
                                         split=SPLIT)
    assert (new.flop_s, new.op_s, new.run_s, new.msg_s) == (5e-12, 1e-6, 2e-5, 1e-5)
    assert new.delay_a == pytest.approx(9e-5 - 1024e-9) and new.delay_b == pytest.approx(1e-9)
    assert new.delay_paced_a == pytest.approx(new.delay_a) and new.delay_paced_b == pytest.approx(1e-9)
    assert new.overhead_unshaped_s == new.overhead_paced_s == new.wake_unshaped_s == new.wake_paced_s == 0.0
    assert new.byte_s == pytest.approx(0.5 * cal.byte_s) and new.codec_encode_s["int8"] == pytest.approx(5e-10)
    assert (new.oversub, new.corun, new.busy_s) == (cal.oversub, cal.corun, cal.busy_s)
    assert host["engine"] == "onnx" and host["cpu_factor"] == pytest.approx(0.5)
    assert planner.single_process(model, "cifar_resnet8", SHAPE, new)["ms"] == 5.0
    busy = {**_pingpong(1e-4), "busy": [{"bytes": 1024, "one_way_s": 4e-4, "send_s": 1e-5}]}
    new, _ = planner.onnx_calibration(cal, model, "cifar_resnet8", SHAPE, ort=ORT, pingpong=busy, split=SPLIT)
    assert new.busy_s == pytest.approx(3e-4)  # what computing on both sides adds to a message
    slow, host = planner.onnx_calibration(cal, model, "cifar_resnet8", SHAPE, ort=ORT, pingpong=busy,
                                          split={"split_factor": 1.5})
    assert (slow.flop_s, slow.op_s, slow.run_s) == pytest.approx((7.5e-12, 1.5e-6, 3e-5))  # the compute, scaled
    assert slow.msg_s == new.msg_s and host["split"] == {"split_factor": 1.5}
    assert host["costs"]["flop_s"] == pytest.approx(7.5e-12)  # the plan records the costs it priced with


def test_split_compute_times_each_rank_of_a_real_onnx_split() -> None:
    """The ranks of a real 2-node ONNX export, run alone by the node engine, against the compute model's
    prediction of the same programs: the factor is what a split costs beyond its FLOPs, measured here."""
    torch.manual_seed(0)
    model = build_model("cifar_resnet8").eval()
    cal = planner.Calibration(flop_s=5e-12, op_s=1e-6, msg_s=0.0, byte_s=0.0, run_s=2e-5)
    res = engines.split_compute(model, SHAPE, cal, reps=3)
    assert len(res["split_node_ms"]) == 2 and min(res["split_node_ms"]) > 0
    slow = max(range(2), key=lambda j: res["split_node_ms"][j])
    assert res["split_factor"] == pytest.approx(res["split_node_ms"][slow] / res["split_node_modelled_ms"][slow],
                                                rel=0.02)  # the ms are rounded to 1 us
    assert min(res["split_node_modelled_ms"]) > 0 and res["split_ratio"] == engines.SPLIT_RATIO
    dear = engines.split_compute(model, SHAPE, dataclasses.replace(cal, msg_s=1e-3, byte_s=1e-6), reps=1)
    assert dear["split_node_modelled_ms"] == res["split_node_modelled_ms"]  # the ranks send nothing: compute only


def test_message_costs_take_the_process_cpu_per_message_and_byte_where_measured() -> None:
    """``cpu_s`` (every thread of the process, the ZeroMQ I/O thread's work included) prices a message and its
    bytes; a ping-pong without it keeps the send call's CPU and leaves the per-byte CPU to the scaled calibration."""
    pp = _pingpong(1e-4)
    pp["unpaced"] = [{**pp["unpaced"][0], "cpu_s": 4e-5}, {**pp["unpaced"][1], "cpu_s": 4e-5 + 262144 * 2e-10}]
    got = engines.message_costs(pp)
    assert got["msg_s"] == pytest.approx(4e-5) and got["byte_s"] == pytest.approx(2e-10)
    assert "byte_s" not in engines.message_costs(_pingpong(1e-4))
    assert engines.message_costs(_pingpong(1e-4))["msg_s"] == 1e-5


def test_price_charges_run_s_per_compute_segment_with_ops() -> None:
    cal = planner.Calibration(flop_s=0.0, op_s=0.0, msg_s=0.0, byte_s=0.0, run_s=1e-3)
    segs = [("c", np.array([0, 3, 0, 0, 0, 0.0])), ("c", np.array([0, 0, 1, 0, 0, 0.0])), ("s", 1, 16, 4)]
    assert [s[1] for s in planner.price([segs], cal)[0][:2]] == [1e-3, 0.0]


def _fake(monkeypatch, one_way_s: float, ort: dict | None = None) -> None:
    monkeypatch.setattr(engines, "ort_costs", lambda *a, **k: ort or ORT)
    monkeypatch.setattr(engines, "zmq_pingpong", lambda *a, **k: _pingpong(one_way_s))
    monkeypatch.setattr(engines, "split_compute", lambda *a, **k: SPLIT)


def _req(**kw) -> planner.PlanRequest:
    return planner.PlanRequest(model="cifar_resnet8", input_shape=SHAPE, bandwidth_bps=None, nodes=(2,),
                               ratios=(0.2,), codecs=("fp32",), cores=2, engine="onnx", **kw)


def test_onnx_plan_predicts_from_the_measured_costs(monkeypatch) -> None:
    """The plan's prediction is the replay priced by the ONNX calibration: a slower transport or a dearer
    session run makes it slower, and it equals the replay done by hand."""
    _fake(monkeypatch, 1e-4)
    fast = planner.plan(_req())
    assert fast["engine"] == "onnx" and fast["host"]["engine"] == "onnx"
    _fake(monkeypatch, 1e-3)
    slow = planner.plan(_req())
    # 0.9 ms more per message: the exchanges of the ~10 mixing layers wait on each other
    assert slow["recommended"]["predicted_ms"] > fast["recommended"]["predicted_ms"] + 5
    _fake(monkeypatch, 1e-4, {**ORT, "run_s": 1e-3})  # ~10 compute segments per rank, 1 ms more each
    assert planner.plan(_req())["recommended"]["predicted_ms"] > fast["recommended"]["predicted_ms"] + 5
    _fake(monkeypatch, 1e-4)
    torch.manual_seed(0)
    model = build_model("cifar_resnet8").eval()
    cal, _ = engines.onnx_calibration(planner.Calibration(), model, "cifar_resnet8", SHAPE)
    part = partition(model, SHAPE, 2)
    from disco.masks import DiscoModel
    from disco.sparsify import magnitude_scores, select_links

    kept = select_links(part, magnitude_scores(DiscoModel(model, part)), 0.2, "global")
    ms = planner.predict_ms(planner.price(planner.programs(part, kept, "fp32"), cal), None, 0.0, cal, 2)
    assert fast["recommended"]["predicted_ms"] == pytest.approx(ms, abs=0.01)


def test_cli_plan_engine_onnx_measures_here(capsys) -> None:
    """Real timings (ONNX Runtime and the ZeroMQ ping-pong on this host): the plan names the engine it priced."""
    assert main(["plan", "cifar_resnet8", "--input-shape", "1,3,32,32", "--nodes", "2", "--ratios", "0.2",
                 "--codecs", "fp32", "--engine", "onnx", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    h = res["host"]
    assert res["engine"] == "onnx" and h["engine"] == "onnx"
    assert h["zmq_one_way_ms"]["unpaced"] > 0 and h["costs"]["run_s"] > 0 and h["costs"]["flop_s"] > 0
    assert h["split"]["split_factor"] > 0 and len(h["split"]["split_node_ms"]) == 2
    assert res["single_process"]["ms"] == h["one_process_ms_here"]
    assert any("--format onnx" in c for c in res["commands"])


def test_cli_plan_engine_table_and_bad_input(monkeypatch, capsys) -> None:
    _fake(monkeypatch, 1e-4)
    args = ["plan", "cifar_resnet8", "--input-shape", "1,3,32,32", "--nodes", "2", "--ratios", "0.2", "--codecs",
            "fp32"]
    assert main([*args, "--engine", "onnx"]) == 0
    out = capsys.readouterr().out
    assert "engine priced: onnx" in out and "ZeroMQ one way 0.100 ms" in out and "--format onnx" in out
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "engine priced: torch" in out and "--format onnx" not in out
    assert main([*args, "--engine", "tflite"]) == 2
    assert "invalid choice: 'tflite'" in capsys.readouterr().err
    real = engines.importlib.util.find_spec
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda m, *a: None if m == "zmq" else real(m, *a))
    assert main([*args, "--engine", "onnx"]) == 2
    err = capsys.readouterr().err
    assert "needs pyzmq: pip install pyzmq" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="engine 'tpu'"):
        planner.plan(_req().__class__(**{**vars(_req()), "engine": "tpu"}))


def test_split_compute_falls_back_to_the_flops_when_the_export_refuses(monkeypatch) -> None:
    """A model the ONNX export refuses (a constant output) is still planned, priced by its FLOPs, and says why."""
    from disco.errors import RefusedError
    from disco.runtime import onnx_export

    def refuse(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise RefusedError("the model's output does not depend on its input")

    monkeypatch.setattr(onnx_export, "export_onnx", refuse)
    torch.manual_seed(0)
    res = engines.split_compute(build_model("cifar_resnet8").eval(), SHAPE, planner.Calibration(), reps=1)
    assert res["split_factor"] == 1.0 and "does not depend" in res["split_refused"]
