"""``disco demo``: the end-to-end story on the embedded model (split, mask, cost, run as real processes)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from ..validate import bandwidth_arg, positive_int


def demo_checkpoint() -> Path | None:
    """The embedded DISCO checkpoint shipped with the package (CIFAR ResNet-20, N=2, r=0.2)."""
    p = Path(__file__).parents[1] / "assets" / "cifar_resnet20_n2_r0.2.safetensors"
    return p if p.is_file() else None



def cmd_demo(args: argparse.Namespace) -> int:
    """The end-to-end story on the embedded model: split, mask, cost, run as real processes."""
    from ..cost import estimate
    from ..graph import partition
    from ..loading import load
    from ..masks import DiscoModel
    from ..models import build_model
    from ..runtime.demo import run_demo
    from ..sparsify import magnitude_scores, select_links

    torch.manual_seed(0)
    ckpt_path = Path(args.checkpoint) if args.checkpoint else demo_checkpoint()
    if ckpt_path is not None:
        loaded = load(ckpt_path)
        dm, part, spec = loaded.model, loaded.partition, loaded.ckpt.model
        if part is None:
            raise ValueError(f"{ckpt_path} is a dense checkpoint; the demo needs a DISCO one")
        acc = loaded.ckpt.info.get("metrics", {}).get("top1")
        title = (f"{ckpt_path.name}: {spec['name']} split over N={part.nodes}"
                 + (f", CIFAR-10 top-1 {acc:.2f}% (measured when it was saved)" if acc is not None else ""))
    else:
        spec = {"name": "cifar_resnet20", "kwargs": {}}
        model = build_model(spec["name"])
        part = partition(model, (1, 3, 32, 32), 2)
        dm = DiscoModel(model, part)
        dm.set_kept(select_links(part, magnitude_scores(dm), 0.2))
        title = "no embedded checkpoint: CIFAR ResNet-20 with random weights, links chosen by magnitude at r=0.2"
    dm.eval()
    say = (lambda *a: None) if args.json else print
    say(title)

    # invariant 1: with every link kept the DISCO model is the plain model with the same weights
    x = torch.randn(8, *part.input_shape[1:])
    kept = dm.kept.copy()
    plain = build_model(spec["name"], **spec.get("kwargs", {})).eval()
    with torch.no_grad():
        dm.set_kept(part.all_links())
        plain.load_state_dict(dm.plain_state_dict())  # all masks are ones: the unmasked weights
        ref = plain(x)
        err1 = ((dm(x) - ref).abs().max() / ref.abs().max()).item()
        dm.set_kept(kept)
    say(f"1. invariant 1, all links kept == original model: max rel. error {err1:.1e}")

    dense, sparse = estimate(part), estimate(part, kept)
    say(f"2. cost model: r = {sparse.ratio:.3f}, {sparse.bytes / 1e3:.1f} KB moved per image instead of "
        f"{dense.bytes / 1e3:.1f} KB ({dense.bytes / max(sparse.bytes, 1):.1f}x less); FLOPs "
        f"{sparse.flops_total / dense.flops_total:.2f}x of dense; weights per node "
        + ", ".join(f"{p / sparse.params_dense:.2f}x" for p in sparse.params_per_node) + " of the whole model")

    bw = args.bandwidth
    res = run_demo(dm, part, spec, bandwidth=bw, iters=args.iters)
    d, k = res["dense"], res["disco"]
    say(f"3. ran as {part.nodes} processes (gloo on 127.0.0.1): output vs single-process model max rel. error "
        f"{k['unshaped']['max_rel_err_vs_single_process']:.1e}; payload bytes sent {k['unshaped']['bytes_sent_total']}"
        f" (cost model {k['unshaped']['bytes_predicted']}); weight bytes per node "
        + ", ".join(str(b) for b in k["unshaped"]["weight_bytes_per_node"]))
    say(f"4. median latency per image (ms): one process {res['single_process_ms']:.2f}; "
        f"unshaped loopback: dense within-layer {d['unshaped']['latency_ms_median']:.2f}, "
        f"DISCO {k['unshaped']['latency_ms_median']:.2f}; emulated {bw} link: dense {d[bw]['latency_ms_median']:.2f}, "
        f"DISCO {k[bw]['latency_ms_median']:.2f} "
        f"({d[bw]['latency_ms_median'] / k[bw]['latency_ms_median']:.1f}x faster)")
    summary = {
        "model": spec["name"], "nodes": part.nodes, "ratio": sparse.ratio, "invariant1_rel_err": err1,
        "bytes": sparse.bytes, "dense_bytes": dense.bytes, "flops_total": sparse.flops_total,
        "flops_dense": dense.flops_dense, "params_per_node": sparse.params_per_node,
        "params_dense": sparse.params_dense, "single_process_ms": res["single_process_ms"],
        "max_rel_err_vs_single_process": k["unshaped"]["max_rel_err_vs_single_process"],
        "bytes_sent_total": k["unshaped"]["bytes_sent_total"],
        "latency_ms": {m: {link: res[m][link]["latency_ms_median"] for link in res[m]} for m in ("dense", "disco")},
    }
    if args.json:
        print(json.dumps(summary))
    return 0



def add_commands(sub: Any) -> None:
    """Register ``demo``."""
    d = sub.add_parser("demo", help="the end-to-end story on the embedded model (no external files)")
    d.add_argument("--checkpoint", help="use this DISCO checkpoint instead of the embedded one")
    d.add_argument("--bandwidth", type=bandwidth_arg, default="100mbit",
                   help="the emulated link for the comparison (e.g. 10mbit, 1gbit)")
    d.add_argument("--iters", type=positive_int, default=20, help="timed inferences per measurement")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_demo)
