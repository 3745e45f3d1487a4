"""``disco serve`` (an ONNX export as a local served group, supervised) and ``disco infer`` (photos to a served
classifier, top-5). See docs/serving.md."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..errors import RefusedError

log = logging.getLogger("disco.notice")


def cmd_serve(args: argparse.Namespace) -> int:
    from ..edge.supervise import Supervisor
    from ..runtime.launch import is_onnx_export

    if not is_onnx_export(args.export):
        raise RefusedError(f"{args.export} is not an ONNX export (no rank0/schedule.json): serve an export made "
                           "with disco export ... --format onnx")
    node = ["--timeout", str(args.timeout)]
    for flag in ("codec", "bandwidth", "latency"):
        if getattr(args, flag) is not None:
            node += [f"--{flag}", str(getattr(args, flag))]
    serve = ["--max-queue", str(args.max_queue), "--inflight", str(args.inflight), "--request-timeout",
             str(args.request_timeout), "--max-body-mb", str(args.max_body_mb)]
    if args.model_name:
        serve += ["--model-name", args.model_name]
    if args.token:
        serve += ["--serve-token", args.token]
    sup = Supervisor(args.export, args.nodes, args.port, args.host, node, serve)
    name = args.model_name or Path(args.export).resolve().name
    print(f"disco serve: {name} on http://{args.host}:{args.port} ({args.nodes} nodes); Ctrl-C stops it",
          file=sys.stderr, flush=True)
    return sup.run()


def cmd_infer(args: argparse.Namespace) -> int:
    from ..edge.client import Client, load_image, preprocessing, top_k

    c = Client(args.url, args.model, args.token)
    meta = c.metadata()
    pre, own = preprocessing(meta)
    if not own:
        log.warning("the export carries no preprocessing: resizing to %s with ImageNet's mean and std",
                    "x".join(map(str, pre["size"])))
    labels = pre.get("labels")
    name = meta["inputs"][0]["name"]
    out_name = meta["outputs"][0]["name"]
    for path in args.images:
        x = load_image(path, pre)
        want = meta["inputs"][0]["shape"]
        if list(x.shape) != list(want):
            raise RefusedError(f"{path}: preprocessed to {list(x.shape)}, the model takes {want}")
        y = c.infer({name: x}, rid=str(path))[out_name]
        print(path)
        for i, p in top_k(y, args.top):
            label = labels[i] if labels and i < len(labels) else f"class {i}"
            print(f"  {p:7.2%}  {label}")
    return 0


def add_commands(sub: Any) -> None:
    """Add ``serve`` and ``infer`` to the ``disco`` command's subparsers."""
    s = sub.add_parser("serve", help="serve an ONNX export as N local processes over the Open Inference Protocol "
                       "(HTTP), restarting a node that ends")
    s.add_argument("export", help="ONNX export folder (disco export ... --format onnx)")
    s.add_argument("--nodes", type=int, required=True, help="N: the export's node count")
    s.add_argument("--port", type=int, default=8000, help="HTTP port of rank 0")
    s.add_argument("--host", default="127.0.0.1", help="HTTP address (another one exposes the model: set --token)")
    s.add_argument("--model-name", help="the model's name in the protocol (default: the export folder's name)")
    s.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (default: $DISCO_SERVE_TOKEN; none)")
    s.add_argument("--codec", help="wire codec: fp32, fp16, int8 (default: the manifest's)")
    s.add_argument("--bandwidth", help="emulated per-node link bandwidth, e.g. 100mbit (default: unshaped)")
    s.add_argument("--latency", help="emulated one-way latency per message, e.g. 2ms")
    s.add_argument("--timeout", type=float, default=10.0, help="seconds of silence before a peer counts as lost")
    s.add_argument("--max-queue", type=int, default=64, help="requests that may wait (then 503)")
    s.add_argument("--inflight", type=int, default=4, help="requests flowing through the schedule at once")
    s.add_argument("--request-timeout", type=float, default=30.0, help="seconds a request may take (then 504)")
    s.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MB (then 413)")
    s.set_defaults(func=cmd_serve)

    i = sub.add_parser("infer", help="send photos to a served classification model and print the top-5 classes")
    i.add_argument("url", help="the server, e.g. http://127.0.0.1:8000 (or .../v2/models/NAME)")
    i.add_argument("images", nargs="+", help="image files (JPEG, PNG, ...)")
    i.add_argument("--model", help="the model's name (default: the one model the server has)")
    i.add_argument("--token", help="bearer token (default: $DISCO_SERVE_TOKEN)")
    i.add_argument("--top", type=int, default=5, help="how many classes to print")
    i.set_defaults(func=cmd_infer)
