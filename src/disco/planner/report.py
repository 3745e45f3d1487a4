"""What ``disco plan`` prints: the reason for the choice, the commands that build it, the table and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .search import PlanRequest

ENGINE_NAMES = {"torch": "torch (PyTorch nodes, gloo; the calibration's costs)",
                "onnx": "onnx (ONNX Runtime nodes, ZeroMQ; compute and messages timed on this host)"}


def commands(res: dict[str, Any], req: PlanRequest, out_dir: str = "plan_export") -> list[str]:
    """The exact commands that build and run the recommended point."""
    c = res["recommended"]
    if c is None:
        return []
    shape = ",".join(map(str, res["input_shape"]))
    shares = f" --shares {','.join(f'{x:g}' for x in c['shares'])}" if c["shares"] else ""
    bw = "" if req.bandwidth_bps is None else f" --bandwidth {req.bandwidth_bps / 1e6:g}mbit"
    latf = f" --latency {req.latency_s * 1e3:g}ms" if req.latency_s else ""
    latf += " --input-at every-node" if req.input_at == "every-node" else ""
    ck = res.get("checkpoint")
    fmt = " --format onnx" if res.get("engine") == "onnx" else ""
    out = []
    if ck:
        if ck["nodes"] == c["nodes"] and abs(ck["ratio"] - c["ratio_target"]) < 0.02:
            src = ck["checkpoint"]
        else:
            src = f"runs/plan_n{c['nodes']}_r{c['ratio_target']:g}.safetensors"
            out.append(f"disco sparsify {ck['checkpoint']} --data DATA --nodes {c['nodes']}{shares} "
                       f"--ratio {c['ratio_target']:g} --out {src}")
        out.append(f"disco export {src} --out {out_dir} --codec {c['codec']}{fmt}")
    else:
        out.append(f"disco sparsify DENSE_CHECKPOINT --data DATA --nodes {c['nodes']}{shares} "
                   f"--ratio {c['ratio_target']:g} --out runs/{res['model']}_n{c['nodes']}_r{c['ratio_target']:g}"
                   ".safetensors   # for accuracy: fine-tune your trained model")
        out.append(f"disco export {res['model']} --nodes {c['nodes']}{shares} --ratio {c['ratio_target']:g} "
                   f"--input-shape {shape} --out {out_dir} --codec {c['codec']}{fmt}   # latency check, random weights")
    out.append(f"disco run {out_dir} --nodes {c['nodes']} --codec {c['codec']}{bw}{latf}")
    return out


def format_table(res: dict[str, Any]) -> str:
    """The Pareto front (and the recommended point, marked *) as a terminal table."""
    rows = [c for c in res["candidates"] if c["pareto"] or c == res["recommended"]]
    lines = [f"{'':2}{'N':>2} {'shares':>8} {'r':>6} {'codec':>6} {'pred. ms':>9} {'MB moved':>9} "
             f"{'max weights MB':>15} {'max memory MB':>14} {'accuracy':>9}"]
    for c in sorted(rows, key=lambda c: c["predicted_ms"]):
        mark = "*" if c == res["recommended"] else " "
        sh = ",".join(f"{x:g}" for x in c["shares"]) if c["shares"] else "equal"
        acc = "-" if c["accuracy"] is None else f"{c['accuracy']:.2f}"
        lines.append(f"{mark:2}{c['nodes']:>2} {sh:>8} {c['ratio_target']:>6g} {c['codec']:>6} "
                     f"{c['predicted_ms']:>9.1f} {c['bytes'] / 1e6:>9.3f} "
                     f"{max(c['weight_bytes_per_node']) / 1e6:>15.1f} "
                     f"{max(c['memory_bytes_per_node']) / 1e6:>14.1f} {acc:>9}")
    s = res["single_process"]
    lines.append(f"one process: {s['ms']:.1f} ms ({s['source']})")
    h = res.get("host")
    if h:
        what = "one ONNX Runtime process" if h.get("engine") == "onnx" else "one process"
        lines.append(f"this host: {what} {h['one_process_ms_here']:.1f} ms against "
                     f"{h['one_process_ms_calibration']:.1f} ms in the calibration: CPU costs x {h['cpu_factor']:.2f}")
    if h and h.get("engine") == "onnx":
        ow = h["zmq_one_way_ms"]
        lines.append(f"this host: ZeroMQ one way {ow['unpaced']:.3f} ms ({ow['paced']:.3f} ms more when paced) for "
                     f"{h['zmq_message_bytes']} B")
    lines.append(f"engine priced: {ENGINE_NAMES.get(res.get('engine', 'torch'), res.get('engine'))}")
    lines.append(res["why"])
    return "\n".join(lines)


def plot(res: dict[str, Any], path: str | Path) -> None:
    """Latency of every candidate (x) against accuracy or r (y); the front joined, the choice marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = res["candidates"]
    have_acc = any(c["accuracy"] is not None for c in cs)
    y = (lambda c: c["accuracy"]) if have_acc else (lambda c: c["ratio_target"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for codec, mk in zip(("fp32", "fp16", "bf16", "int8"), "osD^", strict=True):
        pts = [c for c in cs if c["codec"] == codec and (y(c) is not None)]
        if pts:
            ax.scatter([c["predicted_ms"] for c in pts], [y(c) for c in pts], marker=mk, alpha=0.6,
                       label=codec, c=[c["nodes"] for c in pts], cmap="viridis", vmin=1, vmax=4)
    front = sorted([c for c in cs if c["pareto"] and y(c) is not None], key=lambda c: c["predicted_ms"])
    if front:
        ax.plot([c["predicted_ms"] for c in front], [y(c) for c in front], "k--", lw=1, label="Pareto front")
    r = res["recommended"]
    if r is not None and y(r) is not None:
        ax.scatter([r["predicted_ms"]], [y(r)], s=250, facecolors="none", edgecolors="red", label="recommended")
    ax.axvline(res["single_process"]["ms"], color="gray", lw=1, ls=":", label="one process")
    ax.set_xscale("log")
    ax.set_xlabel("predicted latency per inference (ms)")
    ax.set_ylabel("accuracy" if have_acc else "communication ratio r")
    bw = res["bandwidth_bps"]
    ax.set_title(f"{res['model']} {'x'.join(map(str, res['input_shape']))}, "
                 f"{'unshaped' if bw is None else f'{bw / 1e6:g} Mbit/s'}, {res['latency_s'] * 1e3:g} ms "
                 "(colour: N)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
