"""The split as a service: rank 0 of a 2-process group answers the Open Inference Protocol (tests/serve_group.py).

Every answer is compared with the one-process model; every loop is bounded; no timing is asserted.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.serve_group import Group, build, http, toy_model

SHAPE = [1, 4, 3, 3]


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    d = build(tmp_path_factory.mktemp("serve"))
    with Group(d, extra=["--max-body-mb", "0.01"]) as g:
        yield g


def test_tritonclient_binary_and_json(group: Group) -> None:
    import tritonclient.http as th

    c = th.InferenceServerClient(group.url.removeprefix("http://"))
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("toy")
    meta = c.get_model_metadata("toy")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": SHAPE}]
    assert meta["outputs"] == [{"name": "out", "datatype": "FP32", "shape": SHAPE}]
    assert "binary_tensor_data" in c.get_server_metadata()["extensions"]
    for binary in (True, False):
        x = _x(1 + binary)
        inp = th.InferInput("x", SHAPE, "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        res = c.infer("toy", [inp], request_id=f"req-{binary}",
                      outputs=[th.InferRequestedOutput("out", binary_data=binary)])
        assert res.get_response()["id"] == f"req-{binary}"
        np.testing.assert_allclose(res.as_numpy("out"), toy_model(x), rtol=1e-5, atol=1e-6)
    res = c.infer("toy", [inp])  # no outputs named: all of them, binary (tritonclient's default)
    np.testing.assert_allclose(res.as_numpy("out"), toy_model(x), rtol=1e-5, atol=1e-6)


def test_interleaved_clients_get_their_own_answers(group: Group) -> None:
    """4 clients, 6 different inputs each, at once: each answer is the model's output for its own input."""
    wrong, errors = [], []

    def client(k: int) -> None:
        for i in range(6):
            x = _x(100 * k + i)
            code, body = group.infer_json(x, rid=f"c{k}-{i}")
            if code != 200:
                errors.append((code, body))
                continue
            got = np.asarray(body["outputs"][0]["data"], dtype=np.float32).reshape(SHAPE)
            if body.get("id") != f"c{k}-{i}" or not np.allclose(got, toy_model(x), rtol=1e-5, atol=1e-6):
                wrong.append((k, i))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not wrong


@pytest.mark.parametrize("change, status, words", [
    ({"name": "y"}, 400, "unknown input 'y'"),
    ({"shape": [1, 4, 3, 2]}, 400, "shape [1, 4, 3, 2], the model takes [1, 4, 3, 3]"),
    ({"datatype": "INT64"}, 400, "datatype 'INT64'"),
    ({"data": [1.0, 2.0]}, 400, "'data' has 2 values"),
])
def test_bad_tensors_are_named_and_the_group_keeps_serving(group: Group, change: dict, status: int,
                                                             words: str) -> None:
    t = {"name": "x", "datatype": "FP32", "shape": SHAPE, "data": _x(0).reshape(-1).tolist(), **change}
    code, _, raw = http(group.url + "/v2/models/toy/infer", json.dumps({"inputs": [t]}).encode())
    assert code == status and words in json.loads(raw)["error"]
    assert group.infer_json(_x(3))[0] == 200


def test_malformed_truncated_oversize_and_unknown(group: Group) -> None:
    url = group.url + "/v2/models/toy/infer"
    code, _, raw = http(url, b'{"inputs": [')
    assert code == 400 and "not valid JSON" in json.loads(raw)["error"]
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": SHAPE,
                                   "parameters": {"binary_data_size": 144}}]}).encode()
    code, _, raw = http(url, head + b"\0" * 100, {"Inference-Header-Content-Length": str(len(head))})
    assert code == 400 and "truncated" in json.loads(raw)["error"]
    code, _, raw = http(url, b"[" + b"0," * 20000 + b"0]")  # 40 kB > --max-body-mb 0.01
    assert code == 413 and "exceeds" in json.loads(raw)["error"]
    code, _, raw = http(group.url + "/v2/models/other/infer", b"{}")
    assert code == 404 and "unknown model 'other'" in json.loads(raw)["error"]
    code, _, raw = http(group.url + "/v2/models/toy")
    assert code == 200
    assert group.infer_json(_x(4))[0] == 200


def test_metrics_and_stats(group: Group) -> None:
    assert group.infer_json(_x(5))[0] == 200
    code, _, raw = http(group.url + "/metrics")
    text = raw.decode()
    assert code == 200
    for name in ("disco_requests_total{outcome=\"success\"}", "disco_request_duration_seconds_bucket",
                 "disco_queue_wait_seconds_count", "disco_queue_depth", "disco_ready 1.0",
                 "disco_node_up{rank=\"1\"} 1.0", "disco_sent_bytes_total{peer=\"1\",rank=\"0\"}",
                 "disco_node_compute_seconds_total{rank=\"0\"}", "disco_node_restarts_total{rank=\"1\"} 0.0"):
        assert name in text, name
    code, _, raw = http(group.url + "/v2/models/toy/stats")
    st = json.loads(raw)
    assert code == 200 and st["ready"] and [n["joined"] for n in st["nodes"]] == [True, True]
    assert all(n["rss_mb"] > 0 for n in st["nodes"])


def test_no_state_grows_with_the_requests(group: Group) -> None:
    """The queues of received messages are dropped once read: after many requests each node holds a few (a
    leak of one empty queue per message grew resnet50's nodes by 26 kB per request)."""
    for i in range(40):
        assert group.infer_json(_x(i))[0] == 200
    st = json.loads(http(group.url + "/v2/models/toy/stats")[2])
    keys = [n["stash_keys"] for n in st["nodes"] if n["stash_keys"] is not None]
    assert keys and max(keys) <= 4, st["nodes"]


def test_a_bearer_token_is_required_when_set(tmp_path: Path) -> None:
    d = build(tmp_path)
    with Group(d, extra=["--serve-token", "s3cret"]) as g:
        code, _, raw = http(g.url + "/v2/models/toy")
        assert code == 401 and "bearer token" in json.loads(raw)["error"]
        assert g.infer_json(_x(6))[0] == 401
        assert http(g.url + "/v2/health/ready")[0] == 200  # probes stay open
        code, body = g.infer_json(_x(6), headers={"Authorization": "Bearer s3cret"})
        assert code == 200
        ended = g.stop()  # SIGTERM to rank 0: it tells the others, every rank ends cleanly
    assert {r: c for r, (c, _) in ended.items()} == {0: 0, 1: 0}, ended


@pytest.mark.slow
def test_a_killed_node_rejoins_and_the_group_is_exact_again(tmp_path: Path) -> None:
    """SIGKILL rank 1: not ready, 503 at once; the same command again: ready and exact; a second process for
    the live rank is refused; SIGTERM on rank 0 ends every rank."""
    d = build(tmp_path)
    with Group(d) as g:
        assert g.infer_json(_x(7))[0] == 200
        g.procs[1].send_signal(signal.SIGKILL)
        g.procs[1].wait(10)
        g.wait_ready(False)
        code, body = g.infer_json(_x(8))
        assert code == 503 and "rank 1" in body["error"]
        g.start(1)
        g.wait_ready(True)
        x = _x(9)
        code, body = g.infer_json(x, rid="after")
        assert code == 200 and body["id"] == "after"
        np.testing.assert_allclose(np.asarray(body["outputs"][0]["data"]).reshape(SHAPE), toy_model(x), rtol=1e-5,
                                   atol=1e-6)
        first = g.procs[1]
        second = g.start(1)  # a second claimant of the live rank
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2 and "live" in err, err
        g.procs[1] = first
        code, _, raw = http(g.url + "/metrics")
        assert 'disco_node_restarts_total{rank="1"} 1.0' in raw.decode()
        assert g.infer_json(x)[0] == 200
    # Group.__exit__ sent SIGTERM to rank 0; every process has ended
    assert all(p.poll() is not None for p in g.procs.values())


@pytest.mark.slow
def test_a_hung_node_fails_the_request_in_flight_and_is_told_to_stop(tmp_path: Path) -> None:
    """SIGSTOP rank 1: the request in flight gets 503 once rank 0's --timeout (2 s) passes, never a hang; rank 0
    tells the stopped node to end (it exits 3 when it runs again) and the same command again rejoins."""
    d = build(tmp_path)
    with Group(d, extra=["--timeout", "2"]) as g:
        g.procs[1].send_signal(signal.SIGSTOP)
        code, body = g.infer_json(_x(10))
        assert code == 503 and "rank 1" in body["error"]
        g.wait_ready(False)
        g.procs[1].send_signal(signal.SIGCONT)
        _, err = g.procs[1].communicate(timeout=60)
        assert g.procs[1].returncode == 3 and "dropped rank 1" in err, err
        g.start(1)
        g.wait_ready(True)
        x = _x(11)
        code, body = g.infer_json(x)
        assert code == 200
        np.testing.assert_allclose(np.asarray(body["outputs"][0]["data"]).reshape(SHAPE), toy_model(x), rtol=1e-5,
                                   atol=1e-6)


def test_unknown_paths_and_methods_answer_json_errors(group: Group) -> None:
    code, _, raw = http(group.url + "/v2/nothing")
    assert code == 404 and "Not Found" in json.loads(raw)["error"]
    code, _, raw = http(group.url + "/v2/models/toy/infer")  # GET
    assert code == 405 and "Method Not Allowed" in json.loads(raw)["error"]


def test_a_full_queue_answers_503_at_once_and_says_why(tmp_path: Path) -> None:
    """--max-queue 1, one request in flight, rank 0's messages held 1 s each: of 6 requests sent together, those
    beyond the one running and the one waiting get 503 naming the full queue; the others are exact."""
    d = build(tmp_path)
    with Group(d, extra=["--max-queue", "1", "--inflight", "1", "--latency", "1s"]) as g:
        results = []
        xs = [_x(20 + i) for i in range(6)]
        threads = [threading.Thread(target=lambda x=x: results.append((x, g.infer_json(x)))) for x in xs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        full = [b for _, (c, b) in results if c == 503]
        ok = [(x, b) for x, (c, b) in results if c == 200]
        assert len(full) + len(ok) == 6 and full and ok
        assert all("queue is full" in b["error"] for b in full)
        for x, b in ok:
            np.testing.assert_allclose(np.asarray(b["outputs"][0]["data"]).reshape(SHAPE), toy_model(x), rtol=1e-5,
                                       atol=1e-6)
