"""bench/: the latency sweep's job lists and calibration helpers (the sweep itself is not run in tests)."""

import json

import pytest

from bench import latency


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


def test_the_sweeps_prediction_is_the_planners():
    """The sweep records `disco plan`'s prediction of each setting (one latency model, not a second one)."""
    from bench.latency_fit import predict_setting
    from disco import planner

    p = latency.Prepared("cifar_resnet8", 2)
    progs = planner.programs(p.part, p.kept_at(0.2), "fp16")
    req = planner.PlanRequest(model="cifar_resnet8", input_shape=(1, 3, 32, 32), bandwidth_bps=100e6, nodes=(2,),
                              ratios=(0.2,), codecs=("fp16",), cores=2)
    want = planner.plan(req)["candidates"][0]["predicted_ms"]
    e = {"codec": "fp16", "bandwidth_mbit": 100, "shaping": "pacing"}
    assert predict_setting(progs, e, planner.Calibration(), cores=2) == pytest.approx(want, abs=0.006)
    tc = predict_setting(progs, {**e, "shaping": "tc"}, planner.Calibration(), cores=2)
    assert tc > 0 and tc != pytest.approx(want, abs=0.006)  # kernel shaping is priced as its own link


def test_iterations_fill_two_seconds_for_fast_runs():
    assert latency.iterations(2.0) == (200, 3)  # a 2 ms run: as many as the cap allows
    assert latency.iterations(50.0) == (40, 3)
    assert latency.iterations(400.0) == (20, 3)
    assert latency.iterations(2000.0) == (20, 1)
    assert latency.iterations(20_000.0) == (3, 1)


def test_keys_from_measures_only_what_the_reference_measured(tmp_path):
    jobs = latency.task_jobs(["rrdbnet"])
    first = next(j for j in jobs if not j.get("predict_only"))
    e = {"model": first["model"], "mode": latency.mode_of(first["r"], first["nodes"]), "nodes": first["nodes"],
         "ratio_target": first["r"], "codec": first["codec"], "bandwidth_mbit": first["bw"],
         "shaping": first["shaping"], "latency_ms_median": 1.0}
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"meta": {}, "entries": [e, {**e, "nodes": 4, "latency_ms_median": None}]}))
    kept = [j for j in latency.only_measured_in(jobs, ref) if not j.get("predict_only")]
    assert kept == [first]  # the reference's predicted-only entry (latency_ms_median None) is not measured
    assert len(latency.only_measured_in(jobs, ref)) == len(jobs)


def test_fit_split_puts_every_group_in_both_subsets():
    from bench import latency_fit as fit

    multi = [{"model": m, "nodes": 2, "shaping": s, "r": r} for m in ("a", "b") for r in (0.1, 0.2)
             for s in ("pacing", None)]
    multi.sort(key=lambda e: (e["model"], e["r"], str(e["shaping"])))  # plain key order alternates the links
    calib, held = fit.split(multi)
    assert len(calib) + len(held) == len(multi)
    for group in {(e["model"], e["shaping"]) for e in multi}:
        assert any((e["model"], e["shaping"]) == group for e in calib)
        assert any((e["model"], e["shaping"]) == group for e in held)
    # two codecs at every ratio: both subsets see both codecs and every ratio (a checkerboard, not codec by codec)
    multi = [{"model": "m", "nodes": 2, "shaping": None, "ratio_target": r, "codec": c, "bandwidth_mbit": None}
             for r in (0.0, 0.05, 0.1, 1.0) for c in ("fp16", "fp32")]
    calib, held = fit.split(multi)
    for sub in (calib, held):
        assert {e["codec"] for e in sub} == {"fp16", "fp32"}
        assert {e["ratio_target"] for e in sub} == {0.0, 0.05, 0.1, 1.0}
    assert sorted(map(id, calib + held)) == sorted(map(id, multi))


def test_random_starts_are_seeded_grid_points_best_first():
    from bench import latency_fit as fit

    space = {"a": [0.0, 1.0, 2.0, 3.0], "b": [10.0, 20.0]}

    def score(p: dict) -> tuple[float, float]:
        return abs(p["a"] - 2.0) + abs(p["b"] - 20.0), 0.0

    got = fit.random_starts(space, score, draws=50, keep=3)
    assert got == fit.random_starts(space, score, draws=50, keep=3)  # seeded: the fit is reproducible
    assert got[0] == {"a": 2.0, "b": 20.0} and len(got) == 3
    assert [score(p) for p in got] == sorted(score(p) for p in got)
    assert all(p["a"] in space["a"] and p["b"] in space["b"] for p in got)


def test_ms_scale_runs_are_split_over_launches_and_pooled():
    assert latency.launches(2.0, 200) == (latency.LAUNCHES, 67)
    assert latency.launches(50.0, 40) == (latency.LAUNCHES, 20)  # at least 20 per launch
    assert latency.launches(400.0, 20) == (1, 20)
    rep = {"bytes_sent_total": 10, "peak_rss_mb_per_node": [5.0, 6.0], "max_rel_err_vs_single_process": 1e-7}
    pooled = latency.pool([{**rep, "latency_ms_all": [1.0, 1.0, 1.0], "latency_ms_median": 1.0},
                           {**rep, "latency_ms_all": [3.0, 3.0], "latency_ms_median": 3.0,
                            "peak_rss_mb_per_node": [7.0, 2.0], "max_rel_err_vs_single_process": 2e-7}])
    assert pooled["latency_ms_median"] == 1.0 and pooled["latency_ms_launch_medians"] == [1.0, 3.0]
    assert pooled["peak_rss_mb_per_node"] == [6.0, 4.0]  # per node, the median over its launches
    assert pooled["peak_rss_mb_per_node_per_launch"] == [[5.0, 6.0], [7.0, 2.0]]
    assert pooled["max_rel_err_vs_single_process"] == 2e-7
    with pytest.raises(latency.LaunchError, match="bytes"):
        latency.pool([{**rep, "latency_ms_all": [1.0], "latency_ms_median": 1.0},
                      {**rep, "bytes_sent_total": 11, "latency_ms_all": [1.0], "latency_ms_median": 1.0}])


def test_host_drift_is_the_probes_largest_move_from_the_trace():
    import torch

    from bench import host

    threads = torch.get_num_threads()
    assert host.drift(None, 5.0, 9.0) == 1.0  # a trace from the cache has no probe
    assert host.drift(5.0, 5.0, 5.5) == pytest.approx(1.1)
    assert host.drift(5.0, 4.0, 5.0) == pytest.approx(1.25)  # faster counts as much as slower
    torch.set_num_threads(2)
    try:
        assert host.speed_probe_ms(reps=3) > 0
        assert torch.get_num_threads() == 2  # the probe runs on 1 thread and gives the others back
    finally:
        torch.set_num_threads(threads)


def test_floor_replay_waits_for_messages_and_serialises_the_uplink() -> None:
    """bench/floor.py's timed programs replayed by the latency model: a receive waits for its message, a rank's
    sends share its uplink, the input message can be left out."""
    from bench.floor import every_node, replay, scaled

    r0 = [["cpu", -1, -1, 0, 1.0], ["send", 1, 5, 1000, 0.0], ["send", 1, 7, 1000, 0.0], ["recv", 1, 6, 0, 0.0]]
    r1 = [["recv", 0, 5, 0, 0.0], ["cpu", -1, -1, 0, 0.5], ["recv", 0, 7, 0, 0.0], ["send", 0, 6, 1000, 0.0]]
    assert replay([r0, r1], None) == pytest.approx(1.5)
    # 8000 bit/s: 1 s per message; tag 7 queues behind tag 5 and arrives at 3, rank 1's reply at 4
    assert replay([r0, r1], 8000.0) == pytest.approx(4.0)
    assert replay([scaled(r0, 2.0), scaled(r1, 2.0)], None) == pytest.approx(3.0)
    a = [["send", 1, 1, 1000, 0.0, "input"], ["cpu", -1, -1, 0, 0.5, ""], ["send", 1, 5, 1000, 0.0, "links"]]
    b = [["recv", 0, 1, 0, 0.0, "input"], ["recv", 0, 5, 0, 0.0, "links"]]
    assert replay([a, b], 8000.0) == pytest.approx(2.0)  # tag 5 queues behind the input
    assert replay([every_node(a), every_node(b)], 8000.0) == pytest.approx(1.5)
    with pytest.raises(RuntimeError, match="deadlock"):
        replay([[["recv", 1, 1, 0, 0.0]], [["recv", 0, 1, 0, 0.0]]], None)


def test_edge_plan_of_a_checkpoint_measures_its_own_split() -> None:
    from bench.edge import key, plan

    ck = {"path": "runs/x.safetensors", "nodes": 2, "ratio": 0.2, "budget": "global"}
    items = plan(["tf_efficientnet_lite0"], ["none", "100mbit"], "fp32", ck)
    splits = [i for i in items if i["what"] == "split"]
    assert len(items) == 3 + 4 and {i["engine"] for i in splits} == {"torch", "onnx"}
    assert all(i["checkpoint"] == ck["path"] and i["nodes"] == 2 for i in splits)
    by_name = plan(["tf_efficientnet_lite0"], ["none"], "fp32")
    assert {key(i) for i in splits}.isdisjoint({key(i) for i in by_name})  # never taken for a by-name split
