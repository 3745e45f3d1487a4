"""docs/serving.md's generated section states each target of issue 41 from results/serve.json, and says which
were not measured."""

from __future__ import annotations

from recipes.pages.serving import section


def _load(k: int, tput: float, p50: float, requests: int = 300, **kw: object) -> dict:
    return {"kind": "load", "server": "split", "codec": "fp16", "bandwidth": "1gbit", "clients": k,
            "requests": requests, "answered": requests, "failed": 0, "failed_with_error_body": 0, "wrong": 0,
            "hung": 0, "throughput_per_s": tput, "latency_ms_p50": p50, "latency_ms_p99": p50 * 2,
            "peak_rss_mb_per_node": [150.0, 130.0],
            "rss_mb_per_node": {"1": {"first": 120.0, "after_warmup": 130.0, "last": 130.5, "samples": 40}}, **kw}


def test_each_target_is_stated_with_its_number() -> None:
    data = {"setup": {"model": "resnet50", "input_shape": [1, 3, 224, 224], "nodes": 2, "ratio": 0.2,
                      "pool_inputs": 8, "command": "python -m bench.serve", "host_cpus": 2,
                      "load_average_at_start": [1.0, 1.0, 1.0]},
            "runs": [{"kind": "load_time", "rank1_load_s": 1.5},
                     {"kind": "disco_run", "codec": "fp16", "bandwidth": "1gbit", "latency_ms_median": 50.0,
                      "peak_rss_mb_per_node": [125.0, 128.0]},
                     _load(1, 10.0, 55.0), _load(16, 14.0, 900.0),
                     {**_load(4, 9.0, 300.0), "kind": "fault", "failed": 5, "failed_with_error_body": 5,
                      "fault": {"unready_after_s": 0.6, "down_s": 3.0, "ready_again_s": 2.0}}]}
    text = section(data)
    assert "55 ms served (p50) against 50 ms (`disco run` median), 1.10x: **met**" in text
    assert "150 MB serving at K=1 against 125 MB under `disco run`, +25 MB: **met**" in text
    assert "14.0/s against 10.0/s, 1.40x: **met**" in text
    assert "2.00 s against 1.50 + 3 s: **met**" in text
    assert "over 10,000 requests: **not measured**" in text
    assert "0 wrong, 0 hung over 900 requests in 3 runs, every failure with an error body: **met**" in text
    data["runs"][2] = _load(1, 10.0, 60.0, requests=10000)
    text = section(data)
    assert "1.20x: **not met**" in text and "0.38% (rank 1, 10000 requests; from the single sample" in text
    # a heap trim's dip at the sample a tenth in: the single samples say 3.8%, the medians of the tenths 0.4%
    series = [120.0] * 5 + [130.0, 125.0, 130.0, 130.0, 130.0] + [130.2] * 35 + [130.5] * 5
    data["runs"][2]["rss_mb_per_node"] = {"1": {"first": 120.0, "after_warmup": 125.7, "last": 130.5,
                                                "samples": 500, "series": series}}
    text = section(data)
    assert "0.38% (rank 1, 10000 requests; from the single sample a tenth into the run to the last one: 3.82%): " \
           "**met**" in text
