"""Tables of the runtime's own measurements: faults and soak (docs/faults.md), the planner's validation
(docs/choosing-a-split.md), exchange placement (docs/architectures.md), the latency weight (docs/selection.md)."""

from __future__ import annotations

from .md import md_table


def faults_table(data: dict) -> str:
    """One row per fault case and engine: exit code, seconds to the message and to the exit, the message,
    leftovers; a case that does not apply to an engine says why."""
    rows = []
    for c in data["cases"]:
        engine = c.get("engine", "torch")
        if c.get("not_applicable"):
            rows.append([c["what"], engine, "n/a", "", "", f"not applicable: {c['not_applicable']}", ""])
            continue
        msg = c["message"].replace("|", "\\|")
        msg = msg if len(msg) <= 160 else msg[:157] + "..."
        code = f"{c['exit_code']}" + ("" if c["exit_code"] == c["expected"] else f" ({c['expected']}!)")
        rows.append([c["what"], engine, code, f"{c['seconds']:.1f}", f"{c['seconds_to_exit']:.1f}", msg,
                     f"{c['leftover_processes']}, {c['leftover_files']}"])
    run = [c for c in data["cases"] if not c.get("not_applicable")]
    bad = [f"{c['case']} ({c.get('engine', 'torch')})" for c in run if not c["ok"]]
    return "\n".join([
        f"Every run: `--timeout {data['timeout_s']:g}`, {data['model']} over {data['nodes']} nodes "
        f"(`{data['command'].strip()}`). Seconds count from the fault (from the start for refusals); "
        "\"exit\" adds the launcher's own interpreter teardown.", "",
        md_table(rows, ["case", "engine", "exit code (expected)", "s to message", "s to exit", "message",
                        "leftovers (processes, files)"]), "",
        f"{len(run) - len(bad)} of {len(run)} runs as expected" + (f"; not: {', '.join(bad)}" if bad else "")
        + f"; {len(data['cases']) - len(run)} not applicable."])


def soak_table(data: dict) -> str:
    """Per node: RSS after warm-up and at the end of a long stream, the largest deviation and the slope."""
    rows = [[j, f"{n['rss_mb_after_warmup']:.1f}", f"{n['rss_mb_end']:.1f}", f"{n['max_deviation_pct']:.2f}%",
             f"{n['growth_kb_per_inference']:+.3f} KB", "yes" if n["flat"] else "no"]
            for j, n in enumerate(data["per_node"])]
    return "\n".join([
        f"{data['inferences']} inferences, `--stream {data['stream']}`, {data['model']} over {data['nodes']} "
        f"nodes (`{data['command']}`); the first {data['warmup_fraction']:.0%} of the stream is warm-up.", "",
        md_table(rows, ["node", "RSS after warm-up (MB)", "RSS at the end (MB)", "largest deviation",
                        "growth per inference", f"within {data['tolerance']:.0%}"])])


def latency_weight_table(rows: list[dict]) -> str:
    """Per latency weight: messages, predicted latency and, where run (``--measure``), the measured median."""
    out = []
    for e in rows:
        w = "none" if not e["latency_weight_x"] else f"{e['latency_weight_x']:g} x latency x bandwidth"
        out.append([e["model"], e["nodes"], f"{e['bandwidth_mbit']:g} Mbit/s, {e['latency_ms']:g} ms",
                    f"{e['ratio']:.3f}", w, e["messages_per_inference"], f"{e['predicted_ms']:.0f}",
                    f"{e['predicted_ms_communication_only']:.0f}",
                    f"{e['measured_ms']:.0f}" if e.get("measured_ms") is not None else "not run"])
    return md_table(out, ["model", "N", "link", "r", "latency weight", "messages / inference", "predicted ms",
                          "communication only ms", "measured ms (disco run)"])


def _within(data: dict, key: str, engine: str = "torch") -> str:
    ratios = [e[key] for e in data["entries"] if key in e and e.get("engine", "torch") == engine]
    n = sum(1 for x in ratios if 1 / 1.25 <= x <= 1.25)
    return f"{n} of {len(ratios)} within 1.25x (measured / predicted from {min(ratios):.2f} to {max(ratios):.2f})"


def planner_validation(data: dict) -> str:
    """Each unseen setting: the engine run, the planner's recommendation, predicted (as calibrated, and with
    ``--time-host``) and measured ms, and the host's speed against the calibration's."""
    rows = []
    for e in data["entries"]:
        s, r = e["setting"], e["recommended"]
        rec = f"N={r['nodes']}, r={r['ratio_target']:g}, {r['codec']}" + (
            f", shares {','.join(f'{x:g}' for x in r['shares'])}" if r.get("shares") else "")
        th = ([f"{e['predicted_ms_time_host']:.1f}", f"{e['measured_over_predicted_time_host']:.2f}"]
              if "predicted_ms_time_host" in e else ["-", "-"])
        rows.append([e.get("engine", "torch"), s["model"], s["input_shape"], f"{s['bandwidth']}, {s['latency']}",
                     s["nodes"], rec, f"{e['predicted_ms']:.1f}", f"{e['measured_ms']:.1f}",
                     f"{e['measured_over_predicted']:.2f}", *th])
    out = [md_table(rows, ["engine", "model", "input", "link", "N offered", "recommended", "predicted ms",
                           "measured ms", "measured / predicted", "predicted ms, --time-host",
                           "measured / predicted, --time-host"]),
           "", f"Torch engine as calibrated: {_within(data, 'measured_over_predicted')}."]
    if any("measured_over_predicted_time_host" in e for e in data["entries"]):
        out.append(f"Torch engine with `--time-host`: {_within(data, 'measured_over_predicted_time_host')}.")
    onnx = [e for e in data["entries"] if e.get("engine", "torch") == "onnxruntime"]
    if onnx:
        load = [e[k] for e in onnx for k in ("loadavg_1min_before", "loadavg_1min_after")]
        out.append(f"ONNX engine (`--engine onnx`, timed on this host at plan time): "
                   f"{_within(data, 'measured_over_predicted', 'onnxruntime')}; host load average "
                   f"{min(load):.1f} to {max(load):.1f} during its runs ({onnx[0]['time'][:10]}).")
    h = data.get("host_check")
    if h:
        slow = ", ".join(f"{m} {v['one_process_ms_now']:.1f} ms against {v['quiet_ms']:.1f} ms in results/latency.json "
                         f"({v['slowdown']:.1f}x)" for m, v in h.items() if isinstance(v, dict))
        out.append(f"Host check after the runs ({h['time']}, load {h['loadavg_1min']}): one process {slow}.")
    return "\n".join(out)


def placement_table(rows: list[dict]) -> str:
    """Dense bytes per image at N=2 with channels sent after the channel-local ops (the sender applies them)
    and before them (the receiver applies them: exchange placement)."""
    return md_table([[e["model"], "x".join(map(str, e["input_shape"])), e["nodes"],
                      f"{e['dense_bytes_sender'] / 1e6:.1f}", f"{e['dense_bytes_receiver'] / 1e6:.1f}",
                      f"{e['saving']:.1%}"] for e in rows],
                    ["model", "input", "N", "bytes, sender applies (MB)", "bytes, receiver applies (MB)", "saving"])
