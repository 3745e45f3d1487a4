"""bench/: the latency sweep's job lists and calibration helpers (the sweep itself is not run in tests)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import calibration  # noqa: E402
import latency  # noqa: E402


def test_job_list_puts_the_headline_first_and_repeats_nothing():
    jobs = latency.job_list(["resnet50", "cifar_resnet20"], quick=False)
    assert jobs[0] == dict(model="resnet50", nodes=1, r=1.0, codec="fp32", bw=None, shaping=None)
    assert jobs[1:5] == [dict(model="resnet50", nodes=2, r=r, codec=c, bw=100, shaping="pacing")
                         for c in ("fp32", "fp16") for r in (1.0, 0.2)]
    keys = [tuple(sorted(j.items())) for j in jobs]
    assert len(keys) == len(set(keys))
    assert all(j["shaping"] is None for j in jobs if j["bw"] is None)  # loopback is never shaped


def test_task_jobs_measure_n2_before_n4_and_predict_the_rest():
    jobs = latency.task_jobs(["rrdbnet"])
    measured = [j for j in jobs if not j.get("predict_only")]
    assert [j["nodes"] for j in measured] == sorted(j["nodes"] for j in measured)
    assert {j["bw"] for j in measured} == {100, None, 1000}
    assert all(j["bw"] == 10 for j in jobs if j.get("predict_only"))


def test_delays_use_the_loaded_calibration_unless_told_otherwise():
    meta = {"delay": {"a_s": 1e-4, "b_s_per_byte": 1e-9}, "delay_loaded": {"a_s": 3e-4, "b_s_per_byte": 2e-9},
            "delay_loaded_paced": {"a_s": 5e-4, "b_s_per_byte": 2e-9}}
    d = calibration.delays(meta)
    assert d["none"].a == pytest.approx(3e-4) and d["pacing"].a == pytest.approx(5e-4)
    assert d["none"].b == pytest.approx(2e-9)
    assert calibration.delays({**meta, "delay_model": "idle"})["none"].a == pytest.approx(1e-4)
