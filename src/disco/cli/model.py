"""``disco cost`` and ``disco plan``: what a split of a model costs, and which split to choose for a link."""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path
from typing import Any

from ..errors import RefusedError
from ..validate import (
    as_arg,
    bandwidth_arg,
    check_codec,
    check_nodes,
    check_ratio,
    latency_arg,
    nodes_arg,
    nonnegative_float,
    positive_int,
    ratio_arg,
    shape_arg,
    shares_arg,
)
from .parser import add_threads
from .sparsify import add_budget, budget_options

log = logging.getLogger(__name__)


def cmd_cost(args: argparse.Namespace) -> int:
    from ..api import DiscoModel, estimate, partition, select_links
    from ..checkpoint import is_checkpoint
    from ..cost import format_table
    from ..loading import load
    from ..models import build_model
    from ..validate import check_input_shape, check_nodes_fit, default_input_shape

    if is_checkpoint(args.model):
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
            raise RefusedError(f"--shares has {len(args.shares)} values for --nodes {nodes}")
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



def _memory(s: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)i?b?\s*", s.lower())
    if not m or float(m.group(1)) <= 0:
        raise RefusedError(f"expected a size like 200MB or 1.5GB, got {s!r}")
    return int(float(m.group(1)) * 1000 ** " kmgt".index(m.group(2) or " "))



def _list(item: Any, what: str) -> Any:
    """A comma-separated list whose items pass ``item`` (a validate check)."""
    def conv(s: str) -> tuple:
        try:
            return tuple(item(x.strip()) for x in s.split(",") if x.strip())
        except RefusedError:
            raise
        except ValueError:
            raise RefusedError(f"{what}: expected comma-separated values, got {s!r}") from None
    return conv



def _speed(x: str) -> float:
    v = float(x)
    if not v > 0:
        raise RefusedError(f"a node speed must be > 0, got {x}")
    return v



plan_nodes_arg = as_arg(_list(lambda x: check_nodes(int(x), what="N"), "--nodes"), "nodes")

plan_ratios_arg = as_arg(_list(lambda x: check_ratio(float(x), what="r"), "--ratios"), "ratios")

plan_codecs_arg = as_arg(_list(check_codec, "--codecs"), "codecs")

speeds_arg = as_arg(_list(_speed, "--speeds"), "speeds")

memory_arg = as_arg(_memory, "memory")



NOT_ACCURACY = ("latency.json", "latency_model.json", "codecs.json", "planner_validation.json")


def _accuracy_results(files: list[str] | None, results: Path) -> list[tuple[str, Any]]:
    """(source, loaded JSON) of each ``--accuracy`` file; by default every results JSON in ``results`` but the
    latency, codec and validation ones (a file that is not JSON is skipped)."""
    paths = [Path(f) for f in files] if files else \
        [f for f in sorted(results.glob("*.json")) if f.name not in NOT_ACCURACY]
    out = []
    for f in paths:
        try:
            out.append((f"results/{f.name}" if not files else str(f), json.loads(f.read_text())))
        except (OSError, json.JSONDecodeError) as e:
            if files:
                raise RefusedError(f"--accuracy {f}: {e}") from e
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    from .. import planner
    from ..validate import parse_bandwidth, parse_latency

    req = planner.PlanRequest(
        model=args.model, input_shape=tuple(args.input_shape), bandwidth_bps=parse_bandwidth(args.bandwidth),
        latency_s=parse_latency(args.latency) if args.latency else 0.0, nodes=tuple(args.nodes),
        codecs=tuple(args.codecs), ratios=tuple(args.ratios), max_memory_per_node=args.max_memory_per_node,
        speeds=args.speeds, shares=args.shares, cores=args.cores, max_drop=args.max_drop, weights=args.weights,
        time_host=args.time_host, engine=args.engine, input_at=args.input_at)
    results = Path(args.results)
    cal = planner.Calibration.load(args.calibration or results / "latency_model.json")
    codecs = results / "codecs.json"
    res = planner.plan(req, cal, _accuracy_results(args.accuracy, results),
                       json.loads(codecs.read_text()) if codecs.is_file() else None)
    res["commands"] = planner.commands(res, req)
    if args.plot:
        planner.plot(res, args.plot)
    if args.json:
        print(json.dumps(res))
    else:
        print(planner.format_table(res))
        print("\n".join(["", "commands for the recommended point:"] + [f"  {c}" for c in res["commands"]]))
    return 0



def add_commands(sub: Any) -> None:
    """Register ``cost`` and ``plan``."""
    c = sub.add_parser("cost", help="bytes, FLOPs, weights and memory of a split model")
    c.add_argument("model", help="torchvision or registered model name, or a DISCO checkpoint")
    c.add_argument("--nodes", type=nodes_arg, help="N >= 2 (default 2, or the number of --shares; "
                   "a checkpoint brings its own)")
    c.add_argument("--shares", type=shares_arg, help="node shares of every layer's channels, e.g. 2,1 (default equal)")
    c.add_argument("--ratio", type=ratio_arg, default=1.0,
                   help="target r in [0, 1] for a bare architecture (links chosen by weight magnitude)")
    add_budget(c)
    c.add_argument("--input-shape", type=shape_arg,
                   help="e.g. 1,3,224,224 (default: the model's own, e.g. 1,3,32,32 for the CIFAR models, "
                   "1,3,224,224 for torchvision ImageNet models)")
    c.add_argument("--weights", help="local state-dict file for a bare architecture")
    c.add_argument("--bytes-per-value", type=int, choices=(1, 2, 4), default=4,
                   help="4 = fp32 on the wire, 2 = fp16/bf16, 1 = int8")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    add_threads(c)
    c.set_defaults(func=cmd_cost)

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
    p.add_argument("--results", default="results", help="folder of the results JSON read by default "
                   "(latency_model.json, codecs.json, the accuracy of trained points; default ./results)")
    p.add_argument("--calibration", help="latency model calibration JSON (default RESULTS/latency_model.json, "
                   "else the package's own fit)")
    p.add_argument("--accuracy", action="append", help="results JSON with the accuracy of trained (N, r) points "
                   "(repeatable; default every RESULTS/*.json but latency*, codecs and planner_validation)")
    p.add_argument("--time-host", action="store_true",
                   help="time the model once here (one process, 1 thread) and scale the calibration's CPU costs "
                        "to this machine's speed (when the nodes are machines like this one)")
    p.add_argument("--engine", choices=("torch", "onnx"), default="torch",
                   help="the node engine to price: torch (default; the calibration's costs) or onnx (disco_edge: "
                        "ONNX Runtime compute and ZeroMQ messages, both timed on this host; implies --time-host)")
    p.add_argument("--input-at", choices=("leader", "every-node"), default="leader",
                   help="leader (default): rank 0 sends the input to the nodes; every-node: each node reads the "
                        "input itself (disco run --input-at every-node), no input message is priced")
    p.add_argument("--plot", help="write the Pareto plot here (.png)")
    p.add_argument("--json", action="store_true")
    add_threads(p)
    p.set_defaults(func=cmd_plan)

