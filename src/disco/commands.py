"""Implementations of the ``disco`` subcommands for the core pipeline (cost, sparsify, eval, demo)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from .validate import (
    InputError,
    as_arg,
    bandwidth_arg,
    check_codec,
    check_nodes,
    check_ratio,
    fraction_arg,
    latency_arg,
    nodes_arg,
    nonnegative_float,
    positive_float,
    positive_int,
    ratio_arg,
    shape_arg,
    shares_arg,
)

log = logging.getLogger(__name__)


def _is_checkpoint(s: str) -> bool:
    return s.endswith(".safetensors") or Path(s).is_file()


def cmd_cost(args: argparse.Namespace) -> int:
    from .api import DiscoModel, estimate, partition, select_links
    from .cost import format_table
    from .loading import load
    from .models import build_model
    from .validate import check_input_shape, check_nodes_fit, default_input_shape

    if _is_checkpoint(args.model):
        loaded = load(args.model)
        if loaded.partition is None:
            raise ValueError(f"{args.model} is a dense checkpoint: cost it by its model name with --ratio")
        if args.shares is not None:
            raise ValueError(f"{args.model} is a DISCO checkpoint: its node shares are fixed "
                             f"({loaded.partition.shares or 'equal'}); --shares applies to a model name")
        if args.nodes is not None and args.nodes != loaded.partition.nodes:
            raise ValueError(f"{args.model} is split over N={loaded.partition.nodes}, not --nodes {args.nodes}")
        part, kept = loaded.partition, loaded.model.kept
        if args.input_shape and tuple(args.input_shape) != part.input_shape:
            log.warning("a checkpoint is costed at its own input shape %s", part.input_shape)
    else:
        nodes = args.nodes or (len(args.shares) if args.shares else 2)
        if args.shares and len(args.shares) != nodes:
            raise InputError(f"--shares has {len(args.shares)} values for --nodes {nodes}")
        model = build_model(args.model, weights=args.weights)
        shape = args.input_shape or default_input_shape(args.model, model)
        check_input_shape(model, shape, args.model)
        check_nodes_fit(model, nodes, args.model)
        part = partition(model, shape, nodes, args.shares)
        kept = select_links(DiscoModel(model, part), args.ratio, budget=args.budget, **budget_options(args))
    rep = estimate(part, kept, bytes_per_value=args.bytes_per_value)
    if args.json:
        print(json.dumps(rep.to_json() | {"model": args.model}))
    else:
        print(format_table(rep))
    return 0


def cmd_sparsify(args: argparse.Namespace) -> int:
    from .sparsify.run import SparsifyConfig, sparsify

    cfg = SparsifyConfig(nodes=args.nodes, shares=args.shares, ratio=args.ratio, budget=args.budget,
                         selection=args.selection, **budget_options(args),
                         epochs=args.epochs, prune_fraction=args.prune_fraction, lr=args.lr, lasso=args.lasso,
                         distill=args.distill, limit=args.limit, train_subset=args.train_subset, seed=args.seed,
                         batch_size=args.batch_size, train_images=args.train_images, val_split=args.val_split,
                         optimizer=args.optimizer, weight_decay=args.wd, device=args.device, amp=args.amp,
                         workers=args.workers)
    from . import distributed as D
    from .loading import load
    from .validate import check_data_folder, check_nodes_fit, prepare_output

    dense = load(args.checkpoint)  # a missing or damaged checkpoint is refused before any data is read
    check_nodes_fit(dense.model, args.nodes, dense.ckpt.model["name"])
    check_data_folder(args.data)
    res = sparsify(args.checkpoint, args.data, prepare_output(args.out), cfg)
    if D.is_main():
        print(json.dumps(res | {"checkpoint": args.out}))
    return 0


def budget_options(args: argparse.Namespace) -> dict:
    """The joint budget's caps from the command line (the defaults are the paper's profile)."""
    return {"max_flops": args.max_flops, "max_weights_per_node": args.max_weights_per_node,
            "latency_weight": args.latency_weight / getattr(args, "bytes_per_value", 4)}


def _add_budget(p: argparse.ArgumentParser) -> None:
    from .sparsify.select import BUDGETS, DEFAULT_MAX_FLOPS, DEFAULT_MAX_WEIGHTS_PER_NODE

    p.add_argument("--budget", default="global", choices=BUDGETS,
                   help="global: score per byte over all layers; layer: r in every layer; joint: bytes plus caps on "
                        "FLOPs and weights per node")
    p.add_argument("--max-flops", type=fraction_arg, default=DEFAULT_MAX_FLOPS,
                   help="joint budget: total FLOPs at most this fraction of dense")
    p.add_argument("--max-weights-per-node", type=fraction_arg, default=DEFAULT_MAX_WEIGHTS_PER_NODE,
                   help="joint budget: every node's weights at most this fraction of the whole model's")
    p.add_argument("--latency-weight", type=nonnegative_float, default=0.0,
                   help="global budget: charge every message (exchange) kept this many bytes when ranking links, "
                        "e.g. latency x bandwidth (125000 for 20 ms at 50 Mbit/s): fewer, fuller messages")


def cmd_eval(args: argparse.Namespace) -> int:
    from . import distributed as D
    from .api import evaluate

    out = evaluate(args.checkpoint, args.data, batch_size=args.batch_size, limit=args.limit, device=args.device,
                   amp=args.amp, workers=args.workers)
    if not D.is_main():
        return 0
    if args.json:
        print(json.dumps(out))
    else:
        print("  ".join(f"{k}={v}" for k, v in out.items()))
    return 0


def demo_checkpoint() -> Path | None:
    """The embedded DISCO checkpoint shipped with the package (CIFAR ResNet-20, N=2, r=0.2)."""
    p = Path(__file__).parent / "assets" / "cifar_resnet20_n2_r0.2.safetensors"
    return p if p.is_file() else None


def cmd_demo(args: argparse.Namespace) -> int:
    """The end-to-end story on the embedded model: split, mask, cost, run as real processes."""
    from .cost import estimate
    from .graph import partition
    from .loading import load
    from .masks import DiscoModel
    from .models import build_model
    from .runtime.demo import run_demo
    from .sparsify import magnitude_scores, select_links

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


def _memory(s: str) -> int:
    import re

    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)i?b?\s*", s.lower())
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"expected a size like 200MB or 1.5GB, got {s!r}")
    return int(float(m.group(1)) * 1000 ** " kmgt".index(m.group(2) or " "))


def _list(item: Any, what: str) -> Any:
    """A comma-separated list whose items pass ``item`` (a validate check)."""
    def conv(s: str) -> tuple:
        try:
            return tuple(item(x.strip()) for x in s.split(",") if x.strip())
        except InputError:
            raise
        except ValueError:
            raise InputError(f"{what}: expected comma-separated values, got {s!r}") from None
    return conv


plan_nodes_arg = as_arg(_list(lambda x: check_nodes(int(x), what="N"), "--nodes"), "nodes")
plan_ratios_arg = as_arg(_list(lambda x: check_ratio(float(x), what="r"), "--ratios"), "ratios")
plan_codecs_arg = as_arg(_list(check_codec, "--codecs"), "codecs")
def _speed(x: str) -> float:
    v = float(x)
    if not v > 0:
        raise InputError(f"a node speed must be > 0, got {x}")
    return v


speeds_arg = as_arg(_list(_speed, "--speeds"), "speeds")
memory_arg = as_arg(_memory, "memory")


def cmd_plan(args: argparse.Namespace) -> int:
    from . import planner
    from .validate import parse_bandwidth, parse_latency

    req = planner.PlanRequest(
        model=args.model, input_shape=tuple(args.input_shape), bandwidth_bps=parse_bandwidth(args.bandwidth),
        latency_s=parse_latency(args.latency) if args.latency else 0.0, nodes=tuple(args.nodes),
        codecs=tuple(args.codecs), ratios=tuple(args.ratios), max_memory_per_node=args.max_memory_per_node,
        speeds=args.speeds, shares=args.shares, cores=args.cores, max_drop=args.max_drop, weights=args.weights,
        time_host=args.time_host)
    res = planner.plan(req, planner.Calibration.load(args.calibration) if args.calibration else None)
    res["commands"] = planner.commands(res, req)
    if args.plot:
        planner.plot(res, args.plot)
    if args.json:
        print(json.dumps(res))
    else:
        print(planner.format_table(res))
        print("\n".join(["", "commands for the recommended point:"] + [f"  {c}" for c in res["commands"]]))
    return 0


def add_core_commands(sub: argparse._SubParsersAction) -> None:
    """Register cost, sparsify, eval and demo."""
    from .distributed import add_device_args

    c = sub.add_parser("cost", help="bytes, FLOPs, weights and memory of a split model")
    c.add_argument("model", help="torchvision or registered model name, or a DISCO checkpoint")
    c.add_argument("--nodes", type=nodes_arg, help="N >= 2 (default 2, or the number of --shares; "
                   "a checkpoint brings its own)")
    c.add_argument("--shares", type=shares_arg, help="node shares of every layer's channels, e.g. 2,1 (default equal)")
    c.add_argument("--ratio", type=ratio_arg, default=1.0,
                   help="target r in [0, 1] for a bare architecture (links chosen by weight magnitude)")
    _add_budget(c)
    c.add_argument("--input-shape", type=shape_arg,
                   help="e.g. 1,3,224,224 (default: the model's own, e.g. 1,3,32,32 for the CIFAR models, "
                   "1,3,224,224 for torchvision ImageNet models)")
    c.add_argument("--weights", help="local state-dict file for a bare architecture")
    c.add_argument("--bytes-per-value", type=int, choices=(1, 2, 4), default=4,
                   help="4 = fp32 on the wire, 2 = fp16/bf16, 1 = int8")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    c.set_defaults(func=cmd_cost)

    s = sub.add_parser("sparsify", help="fine-tune a dense checkpoint into a DISCO model at ratio r")
    s.add_argument("checkpoint", help="dense checkpoint (from disco train)")
    s.add_argument("--data", required=True)
    s.add_argument("--nodes", type=nodes_arg, default=2, help="N >= 2")
    s.add_argument("--shares", type=shares_arg, help="node shares of every layer's channels, e.g. 2,1 (default equal)")
    s.add_argument("--ratio", type=ratio_arg, required=True,
                   help="target communication ratio in [0, 1] (0 = separated)")
    _add_budget(s)
    s.add_argument("--selection", default="lasso", choices=("lasso", "magnitude", "taylor", "random"),
                   help="how links are ranked; lasso: a byte-weighted group-lasso penalty first (see --lasso)")
    s.add_argument("--lasso", type=nonnegative_float, default=2.0,
                   help="final group-lasso strength of --selection lasso")
    s.add_argument("--epochs", type=positive_int, default=10)
    s.add_argument("--prune-fraction", type=fraction_arg, default=0.5, help="share of the run spent lowering r")
    s.add_argument("--lr", type=positive_float,
                   help="fine-tuning learning rate (default: the task's; 0.02 for cifar10)")
    s.add_argument("--distill", type=fraction_arg, default=0.0,
                   help="weight in [0, 1] of distillation from the dense model")
    s.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), help="default: the task's")
    s.add_argument("--wd", type=nonnegative_float, help="weight decay (default: the task's)")
    s.add_argument("--batch-size", type=positive_int, default=128)
    s.add_argument("--limit", type=positive_int, help="use only the first LIMIT images of each split (smoke runs)")
    s.add_argument("--train-subset", type=positive_int,
                   help="fine-tune on this many training images (a fixed subset per seed)")
    s.add_argument("--train-images", type=positive_int,
                   help="the run's length as images seen instead of --epochs (the last epoch may end early)")
    s.add_argument("--val-split", type=int, default=0,
                   help="carve this many training images out as a validation split (val_ metrics; the same "
                        "images for every seed), for tuning without the test set (default: 0)")
    s.add_argument("--seed", type=int, default=0,
                   help="seeds everything random: data order, augmentation, subset, random links")
    s.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    add_device_args(s)
    s.add_argument("--out", required=True, help="DISCO checkpoint to write (.safetensors); resumes if interrupted")
    s.set_defaults(func=cmd_sparsify)

    e = sub.add_parser("eval", help="evaluate a checkpoint on its task's test split")
    e.add_argument("checkpoint")
    e.add_argument("--data", required=True)
    e.add_argument("--batch-size", type=positive_int, default=500)
    e.add_argument("--limit", type=positive_int, help="evaluate only the first LIMIT test images")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    add_device_args(e)
    e.set_defaults(func=cmd_eval)

    p = sub.add_parser("plan", help="choose N, r and the wire codec for a link (predicted latency, memory, accuracy)")
    p.add_argument("model", help="model name (as in `disco cost`) or a DISCO/dense checkpoint")
    p.add_argument("--input-shape", type=shape_arg, required=True, help="e.g. 1,3,224,224")
    p.add_argument("--bandwidth", type=bandwidth_arg,
                   help="per-node link bandwidth, e.g. 100mbit (default: unshaped loopback)")
    p.add_argument("--latency", type=latency_arg, help="one-way latency per message, e.g. 2ms")
    p.add_argument("--nodes", type=plan_nodes_arg, default=(2, 3, 4), help="candidate N, e.g. 2,3,4")
    p.add_argument("--codecs", type=plan_codecs_arg, default=("fp32", "fp16", "int8"))
    p.add_argument("--ratios", type=plan_ratios_arg, default=(1.0, 0.2, 0.1, 0.05, 0.0))
    p.add_argument("--max-memory-per-node", type=memory_arg, help="weights + peak activations, e.g. 200MB")
    p.add_argument("--speeds", type=speeds_arg, help="relative compute speed of node 0, 1, ... e.g. 1,1,0.5 "
                   "(unequal speeds also try shares in proportion)")
    p.add_argument("--shares", type=shares_arg, help="plan only N = len(shares) with these node shares, e.g. 2,1")
    p.add_argument("--cores", type=positive_int, help="all nodes share one host with this many cores (as `disco run` "
                   "on one machine); default: one device per node")
    p.add_argument("--max-drop", type=nonnegative_float, default=1.0,
                   help="accuracy points the recommendation may lose")
    p.add_argument("--weights", help="local state-dict file for a model name")
    p.add_argument("--calibration", help="latency model calibration JSON (default results/latency_model.json)")
    p.add_argument("--time-host", action="store_true",
                   help="time the model once here (one process, 1 thread) and scale the calibration's CPU costs "
                        "to this machine's speed (when the nodes are machines like this one)")
    p.add_argument("--plot", help="write the Pareto plot here (.png)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    p.set_defaults(func=cmd_plan)

    d = sub.add_parser("demo", help="the end-to-end story on the embedded model (no external files)")
    d.add_argument("--checkpoint", help="use this DISCO checkpoint instead of the embedded one")
    d.add_argument("--bandwidth", type=bandwidth_arg, default="100mbit",
                   help="the emulated link for the comparison (e.g. 10mbit, 1gbit)")
    d.add_argument("--iters", type=positive_int, default=20, help="timed inferences per measurement")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_demo)

