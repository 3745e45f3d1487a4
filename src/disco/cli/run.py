"""``disco export`` and ``disco run``: thin handlers over :mod:`disco.api` (export, export_model_name, run)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from ..validate import (
    check_data_folder,
    codec_arg,
    nodes_arg,
    positive_float,
    ratio_arg,
    shape_arg,
    shares_arg,
)
from .sparsify import add_budget

log = logging.getLogger(__name__)


def _caps(args: argparse.Namespace) -> dict[str, float]:
    """The joint budget's caps (only with --budget joint: the other budgets take none)."""
    if args.budget != "joint":
        return {}
    return {"max_flops": args.max_flops, "max_weights_per_node": args.max_weights_per_node}


def cmd_export(args: argparse.Namespace) -> int:
    from ..api import export, export_model_name
    from ..checkpoint import is_checkpoint

    if is_checkpoint(args.ckpt):
        if args.ratio is not None or args.shares is not None or args.nodes is not None or args.latency_weight:
            raise ValueError(f"{args.ckpt} is a checkpoint: it brings its own N, shares and kept links "
                             "(--nodes/--shares/--ratio/--latency-weight are for a model name)")
        man = export(args.ckpt, args.out, codec=args.codec, fmt=args.format)
    else:
        nodes = args.nodes or (len(args.shares) if args.shares else 2)
        man = export_model_name(args.ckpt, args.out, nodes, 1.0 if args.ratio is None else args.ratio,
                                args.input_shape, args.shares, args.budget, args.codec,
                                args.weights, latency_weight=args.latency_weight, fmt=args.format, **_caps(args))
    summary = {"out": args.out, "format": args.format, "nodes": man["nodes"], "ratio": man["ratio"]}
    if args.format == "onnx":
        summary |= {"files": len(man["files"]), "max_rel_err_onnx": man["max_rel_err_onnx"],
                    "bytes_predicted": man["bytes_predicted"]}
    else:
        summary |= {"params_per_node": [s["params"] for s in man["shards"]],
                    "bytes_per_node": [s["bytes"] for s in man["shards"]], "params_dense": man["params_dense"]}
    print(json.dumps(summary) if args.json else "\n".join(f"{k}: {v}" for k, v in summary.items()))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..api import run
    from ..errors import RefusedError, RunFailure
    from ..runtime.launch import is_onnx_export, launch
    from ..runtime.options import RunOptions

    if args.data is not None:
        check_data_folder(args.data)
    try:
        if is_onnx_export(args.dir):  # the torch-free engine (disco_edge) checks the folder and options itself
            rep = launch(args.dir, args.nodes, RunOptions.from_args(args), timeout=args.run_timeout)
        else:
            rep = run(args.dir, args.nodes, run_timeout=args.run_timeout, options=RunOptions.from_args(args),
                      progress=_progress_bar() if args.data is not None else None)
    except (RefusedError, RunFailure) as e:
        print(f"disco run: error: {e}", file=sys.stderr)
        return e.exit_code
    if args.json:
        print(json.dumps(rep))
    else:
        _print_report(rep)
    err = rep.get("max_rel_err_vs_single_process")
    limit = args.max_rel_err if args.max_rel_err is not None else (1e-4 if rep.get("codec") == "fp32" else None)
    if err is not None and limit is not None and err > limit:
        print(f"disco run: error: the split output differs from the single-process model by {err:.2e} "
              f"(max rel. error allowed {limit:g}, --max-rel-err)", file=sys.stderr)
        return 3
    return 0


def _progress_bar() -> Any:
    """A progress callback for ``launch``: a tqdm bar on stderr when it is a terminal (the report's
    test-split line is the final word either way)."""
    from tqdm import tqdm

    state: dict[str, Any] = {}

    def cb(done: int, total: int) -> None:
        if "bar" not in state:
            state["bar"] = tqdm(total=total, desc="test split", unit="batch", file=sys.stderr,
                                disable=not sys.stderr.isatty(), leave=False, dynamic_ncols=True)
        bar = state["bar"]
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return cb


def link_text(r: dict[str, Any]) -> str:
    """'100 Mbit/s, 2 ms latency', 'unshaped' ... for a report's link."""
    bw, lat = r.get("bandwidth_mbit"), r.get("latency_s") or 0.0
    return ("unshaped" if bw is None else f"{bw:g} Mbit/s") + (f", {lat * 1e3:g} ms latency" if lat else "")


def _print_report(r: dict[str, Any]) -> None:
    err = r["max_rel_err_vs_single_process"]
    print(f"{r['model']} on {r['nodes']} processes, r = {r['ratio']:.3f}, codec {r['codec']}, link {link_text(r)}")
    print(f"latency median {r['latency_ms_median']:.2f} ms, throughput {r['throughput_per_s']:.1f}/s")
    print(f"bytes sent {r['bytes_sent_total']} (cost model {r['bytes_predicted']}), input+output "
          f"{r['bytes_input_output']}")
    print("max rel. error vs single process: " + ("n/a" if err is None else f"{err:.2e}"))
    if "data" in r:
        d = r["data"]
        print(f"{d['task']} test split through the split model ({d['n']} inputs): "
              + ", ".join(f"{k} {v:.2f}" for k, v in d.items() if k not in ("task", "n")))
    print("weights per node: " + ", ".join(f"{b / 1e6:.3f} MB" for b in r["weight_bytes_per_node"])
          + "; peak RSS per node: " + ", ".join(f"{m:.0f} MB" for m in r["peak_rss_mb_per_node"]))


def add_commands(sub: Any) -> None:
    """Add ``export`` and ``run`` to the ``disco`` command's subparsers."""
    from ..runtime.options import RunOptions

    e = sub.add_parser("export", help="write one weight shard per node + a manifest from a DISCO checkpoint")
    e.add_argument("ckpt", help="sparsified DISCO checkpoint (.safetensors), or a model name as in `disco cost` "
                   "(random init, magnitude links at --ratio: for latency, not accuracy)")
    e.add_argument("--nodes", type=nodes_arg, help="model name: N >= 2 (default 2, or the number of --shares)")
    e.add_argument("--shares", type=shares_arg, help="model name: node shares, e.g. 2,1 (default equal)")
    e.add_argument("--ratio", type=ratio_arg, help="model name: target r in [0, 1] (default 1 = dense)")
    add_budget(e)  # model name: --budget (global, layer, joint and its caps), --latency-weight
    e.add_argument("--input-shape", type=shape_arg, help="model name: e.g. 1,3,224,224 (default: the model's own)")
    e.add_argument("--weights", help="model name: local state-dict file")
    e.add_argument("--out", required=True,
                   help="export folder (created): nodeJ.safetensors per node, manifest.json, reference.safetensors")
    e.add_argument("--codec", type=codec_arg, default="fp32",
                   help="default wire codec recorded in the manifest: fp32, fp16, bf16, int8")
    e.add_argument("--format", choices=("torch", "onnx"), default="torch",
                   help="torch: node shards for the torch runtime; onnx: a folder per rank (rankR/) with its ONNX "
                        "segment graphs and schedule.json, proved in onnxruntime")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=cmd_export)

    r = sub.add_parser("run", help="run an export as N local processes over torch.distributed and report")
    r.add_argument("dir", help="export directory")
    r.add_argument("--nodes", type=nodes_arg, required=True, help="N: the export's node count")
    RunOptions.add_arguments(r)
    r.add_argument("--run-timeout", type=positive_float, default=3600.0, help="seconds for the whole run")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_run)
