"""The node program: ``python -m disco_edge FOLDER --rank R --nodes N (--leader HOST:PORT | --peers ...)``.

Start-up: verify the rank folder (exit 2 on anything wrong), load the graphs, meet the peers, run the shipped
reference input once (the self-test: rank 0 refuses to serve above ``--max-rel-err``, exit 3), then serve
``--warmup`` + ``--iters`` inferences of the input (rank 0 drives: a ``go`` control message per inference, ``end``
at the end). Every rank sends rank 0 its own figures; rank 0 writes the report (``--result``, or stdout).
Errors: one line ``disco node R: error: ...`` on stderr, exit 2 (refused) or 3 (failed); the peers are told.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import EXIT_FAILED, Failed, Refused, WrongAnswer
from .procstat import peak_rss_mb, rss_mb, torch_loaded

log = logging.getLogger("disco_edge")
PARENT_ENV = "DISCO_LAUNCHER_PID"  # set by disco run's launcher (as disco.runtime.node)
UNSUPPORTED = ("data", "limit")  # run options of the torch engine this one refuses


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="disco-node", description=__doc__.splitlines()[0])
    p.add_argument("folder", help="the export folder, or one rank folder (rankR/) copied with manifest.json")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--nodes", "--world-size", dest="nodes", type=int, required=True)
    p.add_argument("--leader", help="rank 0's host:port (the rendezvous)")
    p.add_argument("--peers", help="every rank's host:port, in rank order (instead of --leader)")
    p.add_argument("--host", default="127.0.0.1", help="with --leader: this node's address for its peers")
    p.add_argument("--codec", help="wire codec: fp32 (default: the manifest's), fp16, int8")
    p.add_argument("--bandwidth", help="emulated per-node link bandwidth, e.g. 100mbit (default: unshaped)")
    p.add_argument("--latency", help="emulated one-way latency per message, e.g. 2ms")
    p.add_argument("--input", help="rank 0 (every rank with --input-at every-node): input .npy (default: the "
                   "reference input)")
    p.add_argument("--input-at", default="leader", choices=("leader", "every-node"),
                   help="leader (default): rank 0 reads the input and sends it to the ranks that need it; every-node: "
                   "each node reads the same input itself (a camera that sends each frame to every node), no input "
                   "message after the self-test")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--stream", type=int, default=0,
                   help="rank 0: after the timed inferences, --iters more with this many in flight (throughput)")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds of silence from a peer before giving up")
    p.add_argument("--startup-timeout", type=float, default=20.0, help="seconds for all nodes to join")
    p.add_argument("--max-rel-err", type=float,
                   help="largest relative error against the export's reference: the self-test's (always on the "
                   "lossless fp32 codec; default 1e-4) and the first served inference's (the run's codec; default 1e-4 "
                   "with fp32, unchecked with a lossy codec unless given), as the torch engine")
    p.add_argument("--graph-opt", default="all", choices=("basic", "extended", "all"),
                   help="ONNX Runtime graph optimisation level (default all: resnet50 N=2 r=0.2, a node 39 ms "
                   "and 123 MB peak at all, 47 ms and 122 MB at basic)")
    p.add_argument("--threads", type=int, default=1, help="compute threads: 1 (one thread = one device)")
    p.add_argument("--io-nice", type=int, default=19, help="accepted for the torch engine's flags; unused")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 checks (tests only)")
    p.add_argument("--result", help="rank 0: write the report (JSON) here")
    g = p.add_argument_group("serving (rank 0; the other ranks follow the leader's mode by themselves)")
    g.add_argument("--serve", metavar="HOST:PORT",
                   help="keep the group up and answer Open Inference Protocol (v2) requests over HTTP here "
                   "(e.g. 127.0.0.1:8000); needs --leader; see docs/serving.md")
    g.add_argument("--model-name", help="the model's name in the protocol (default: the export folder's name)")
    g.add_argument("--serve-token", help="require 'Authorization: Bearer TOKEN' (default: $DISCO_SERVE_TOKEN; "
                   "none)")
    g.add_argument("--max-queue", type=int, default=64, help="requests that may wait (default 64; then 503)")
    g.add_argument("--inflight", type=int, default=4,
                   help="requests flowing through the schedule at once (default 4)")
    g.add_argument("--request-timeout", type=float, default=30.0,
                   help="seconds a request may take, queue included (default 30; then 504)")
    g.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body (default 64 MB; 413)")
    for name in UNSUPPORTED:
        p.add_argument("--" + name, help=argparse.SUPPRESS)
    return p


def check_args(a: argparse.Namespace) -> None:
    """Refuse options that cannot work, before anything is loaded."""
    bad = [n for n in UNSUPPORTED if getattr(a, n) is not None]
    if bad:
        raise Refused(f"--{bad[0]} is not supported by the onnxruntime engine (run a torch export for it)")
    least = 1 if getattr(a, "serve", None) is not None else 2  # one process serving a whole model (a baseline)
    if a.nodes < least or not 0 <= a.rank < a.nodes:
        raise Refused(f"--rank {a.rank} --nodes {a.nodes}: need N >= {least} and 0 <= rank < N")
    if (a.leader is None) == (a.peers is None):
        raise Refused("give either --leader HOST:PORT (rank 0's address) or --peers HOST:PORT,... (one per rank)")
    if a.input is not None and not a.input.endswith(".npy"):
        raise Refused(f"--input {a.input}: the onnxruntime engine reads a .npy file (numpy.save)")
    if a.threads != 1:
        raise Refused(f"--threads {a.threads}: the onnxruntime engine computes on one thread")
    if getattr(a, "serve", None) is not None:
        if a.rank != 0:
            raise Refused("--serve is rank 0's: start the other ranks without it (they follow the leader)")
        if a.leader is None:
            raise Refused("--serve needs --leader HOST:PORT (ranks rejoin through the leader's address)")
        if a.max_queue < 1 or a.inflight < 1 or not a.request_timeout > 0 or not a.max_body_mb > 0:
            raise Refused("--max-queue >= 1, --inflight >= 1, positive --request-timeout and --max-body-mb please")
    if a.iters < 1 or a.warmup < 0 or a.stream < 0 or not a.timeout > 0 or not a.startup_timeout > 0:
        raise Refused("--iters >= 1, --warmup >= 0, --stream >= 0 and positive --timeout / --startup-timeout "
                      "please")


class Node:
    """One rank's start-up, self-test, serving loop and report."""

    def __init__(self, a: argparse.Namespace) -> None:
        from . import bundle, hooks
        from .codecs import get_codec
        from .link import LinkModel, parse_bandwidth, parse_latency

        self.a = a
        self.link = LinkModel(parse_bandwidth(a.bandwidth), parse_latency(a.latency))
        self.b = bundle.load(a.folder, a.rank, a.nodes, verify=not a.no_verify)
        self.codec = get_codec(a.codec or self.b.manifest.get("codec") or "fp32")
        self.ref = self.b.reference() if a.rank == 0 else None
        if a.rank == 0 and self.ref is None:
            raise Refused(f"{self.b.folder} has no reference.npz (rank 0 needs it for the self-test)")
        self.x = self._read_input()
        self.tr: Any = None
        self.rss_stream: list[float] = []  # this node's RSS after each inference of the stream
        self.hooks = hooks.from_env()  # {} unless DISCO_NODE_HOOKS is set (fault injection)

    def fire(self, point: str, **context: Any) -> None:
        """Run the hooks installed at ``point`` (none in production)."""
        for fn in self.hooks.get(point, ()):
            fn(rank=self.a.rank, **context)

    def start(self) -> None:
        from .engine import Engine
        from .membership import GroupTransport

        a = self.a
        self.tr = GroupTransport(a.rank, a.nodes, self.b.token(), self.link, timeout=a.startup_timeout)
        parent = os.environ.get(PARENT_ENV, "")
        self.tr.parent = int(parent) if parent.isdigit() else None
        # sessions first: a bad graph refuses before joining
        self.engine = Engine(self.b, self.tr, self.codec, a.graph_opt)
        if a.peers is not None:
            self.tr.start_peers([p.strip() for p in a.peers.split(",")])
        else:
            self.tr.start_leader(a.leader, a.host)
        self.tr.timeout = a.timeout

    def self_test(self) -> float | None:
        """Run the reference input once with the lossless fp32 codec whatever ``--codec`` (every rank alike, as
        the torch engine's self-test); rank 0 refuses above the limit. Returns the error (rank 0)."""
        with self.lossless():
            out = self._step(self.ref[0] if self.ref else None)
        if self.ref is None:
            return None
        err = self.check(out, "self-test")
        log.info("self-test passed: rel. err %.2e", err)
        return err

    @contextlib.contextmanager
    def lossless(self) -> Iterator[None]:
        """The engine on the fp32 wire codec for a while (the self-test)."""
        from .codecs import RAW

        self.engine.codec = RAW
        try:
            yield
        finally:
            self.engine.codec = self.codec

    def check(self, out: list[np.ndarray], what: str) -> float:
        """Rank 0: the error of an output of the reference input; above the limit: exit 3. ``what``: "self-test"
        (lossless codec; limit ``--max-rel-err``, default 1e-4: above it the export or the engine is broken), or
        a served inference (the run's codec; limit ``--max-rel-err``, default 1e-4 with fp32, unchecked with a
        lossy codec unless given)."""
        from .engine import rel_err

        err = rel_err(out, self.ref[1])
        if what == "self-test":
            limit = 1e-4 if self.a.max_rel_err is None else self.a.max_rel_err
            if not err <= limit:
                raise WrongAnswer(f"self-test (lossless fp32 codec): the output differs from the export's reference by "
                             f"{err:.2e} (max rel. error allowed {limit:g}, --max-rel-err): a damaged export or a "
                             "broken engine")
            return err
        limit = self.a.max_rel_err if self.a.max_rel_err is not None else (
            1e-4 if self.codec.name == "fp32" else None)
        if limit is not None and not err <= limit:
            raise WrongAnswer(f"{what} (codec {self.codec.name}): the split output differs from the single-process "
                              f"model by {err:.2e} (max rel. error allowed {limit:g}, --max-rel-err)")
        return err

    def _step(self, x: list[np.ndarray] | None) -> list[np.ndarray]:
        """One inference; rank 0 tells the others to go first (they wait for it)."""
        if self.a.rank == 0:
            for j in range(1, self.a.nodes):
                self.tr.send_control(j, {"go": True})
        elif not self.tr.control(0).get("go"):
            raise Failed("rank 0 ended the run before the self-test")
        return self.engine.infer(x)

    def serve(self) -> dict[str, Any]:
        """Rank 0: warm-up + timed inferences, then the stream (``--stream``), then ``end``; others: follow
        ``go`` until ``end``."""
        a = self.a
        x = None if a.rank != 0 else (self.ref[0] if self.x is None else [self.x])
        if a.input_at == "every-node":
            self.engine.local = self._local_input()
            self._same_input(x)
        if a.rank != 0:
            k = i = 0
            while (go := self.tr.control(0)).get("go"):
                if not go.get("stream"):
                    self.fire("inference", k=k)
                    self.engine.infer(None)
                    k += 1
                    continue
                self.fire("stream", i=i)
                self.engine.infer(None, flush=False)
                self.rss_stream.append(round(rss_mb(), 2))
                i += 1
            self.tr.flush()
            return {}
        lat, served = [], None
        for k in range(a.warmup + a.iters):
            self.fire("inference", k=k)
            t0 = time.perf_counter()
            out = self._step(x)
            lat.append(time.perf_counter() - t0)
            if k == 0 and self.x is None:  # the reference served: its first output is checked as the self-test's
                served = self.check(out, "first served inference")
        stream_s = self._stream(x) if a.stream else None
        for j in range(1, a.nodes):
            self.tr.send_control(j, {"go": False})
        return {"lat": lat[a.warmup:], "stream_s": stream_s, "served_err": served}

    def _input_steps(self) -> list[dict[str, Any]]:
        return [st for st in self.b.schedule["steps"] if st["op"] == "recv" and st.get("kind") == "input"]

    def _read_input(self) -> np.ndarray | None:
        """``--input`` of a rank that reads it (rank 0; every rank with ``--input-at every-node``), checked
        against the shape this rank's schedule receives, before anything runs."""
        a = self.a
        if a.input is None or (a.rank != 0 and a.input_at != "every-node"):
            return None
        try:
            x = np.load(a.input).astype(np.float32)
        except (OSError, ValueError) as e:
            raise Refused(f"--input {a.input}: cannot read it ({e})") from None
        want = self.b.schedule["inputs"] if a.rank == 0 else self._input_steps()
        if len(want) != 1 or list(x.shape) != [int(d) for d in want[0]["shape"]]:
            raise Refused(f"--input {a.input}: shape {list(x.shape)}, this rank reads "
                          f"{[st['shape'] for st in want]}" + (" (--input-at every-node: every node the same input)"
                                                                if a.rank else ""))
        return x

    def _local_input(self) -> dict[str, np.ndarray]:
        """``--input-at every-node``: the input values this rank would have received: its own ``--input``, else
        the input the self-test brought (the export's reference input). Rank 0 feeds its own, as always."""
        steps = self._input_steps()
        if self.a.rank == 0 or not steps:
            return {}
        if self.x is None:
            return {st["value"]: self.engine.received[st["value"]] for st in steps}
        return {steps[0]["value"]: self.x}

    def _same_input(self, x: list[np.ndarray] | None) -> None:
        """``--input-at every-node``: rank 0 checks that each rank reads the input rank 0 serves (sha256 per
        value), so that a node fed another input cannot make the split compute another function silently."""
        import hashlib

        def sha(v: np.ndarray) -> str:
            return hashlib.sha256(np.ascontiguousarray(v, dtype=np.float32).tobytes()).hexdigest()

        if self.a.rank != 0:
            self.tr.send_control(0, {"input_sha": {k: sha(v) for k, v in self.engine.local.items()}})
            return
        mine = {spec["name"]: sha(v) for spec, v in zip(self.b.schedule["inputs"], x or [], strict=True)}
        for j in range(1, self.a.nodes):
            theirs = self.tr.control(j).get("input_sha", {})
            if any(mine.get(k) != v for k, v in theirs.items()):
                raise Failed(f"--input-at every-node: rank {j} reads another input than rank 0 (every node must "
                             "read the same input: the same --input file, or none)")

    def _stream(self, x: list[np.ndarray]) -> float:
        """Rank 0: ``--iters`` inferences with up to ``--stream`` of them started by the others before rank 0
        has finished the earlier ones (a ``go`` is sent that far ahead; messages of a later inference wait in
        their queue, in order). Returns the seconds."""
        a, ahead = self.a, 0
        t0 = time.perf_counter()
        for i in range(a.iters):
            self.fire("stream", i=i)
            while ahead < min(a.iters, i + a.stream):
                for j in range(1, a.nodes):
                    self.tr.send_control(j, {"go": True, "stream": True})
                ahead += 1
            self.engine.infer(x, flush=False)
            self.rss_stream.append(round(rss_mb(), 2))
        self.tr.flush()
        return time.perf_counter() - t0

    def stats(self) -> dict[str, Any]:
        every = max(1, len(self.rss_stream) // 40)  # about 40 samples along the stream, and its end
        rss = self.rss_stream[::every] + self.rss_stream[-1:] if self.rss_stream else []
        return {"rank": self.a.rank, "peak_rss_mb": peak_rss_mb(), "torch_in_node": torch_loaded(),
                "weight_bytes": self.b.weight_bytes, "rss_mb_stream": rss,
                **self.engine.counters.as_dict()}  # the last inference's: every one sends the same


def report(node: Node, err: float | None, lat: list[float], stream_s: float | None,
           all_stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's report: the torch runtime's fields where they apply, plus ``engine``."""
    man, link = node.b.manifest, node.link
    bpv = node.codec.bytes_per_value
    return {
        "engine": "onnxruntime", "nodes": node.a.nodes, "model": (man.get("model") or {}).get("name"),
        "input_shape": node.b.schedule["inputs"][0]["shape"], "codec": node.codec.name, "ratio": man.get("ratio"),
        "input_at": node.a.input_at,
        "bandwidth_mbit": None if link.bandwidth_bps is None else link.bandwidth_bps / 1e6,
        "latency_s": link.latency_s, "shaping": "pacing" if link.shaped else None,
        "latency_ms_median": float(np.median(lat) * 1e3), "latency_ms_all": [t * 1e3 for t in lat],
        "throughput_per_s": node.a.iters / stream_s if stream_s else float(1.0 / np.median(lat)),
        "stream": node.a.stream,
        "bytes_sent_total": int(sum(s["payload_bytes"] for s in all_stats)),
        "bytes_predicted": None if "bytes_predicted" not in man else int(man["bytes_predicted"] // 4 * bpv),
        "bytes_codec_overhead": int(sum(s["overhead_bytes"] for s in all_stats)),
        "bytes_input_output": int(sum(s["other_bytes"] for s in all_stats)),
        "bytes_stats": int(sum(s["stats_bytes"] for s in all_stats)),
        "max_rel_err_vs_single_process": err,
        "peak_rss_mb_per_node": [s["peak_rss_mb"] for s in all_stats],
        "torch_in_node": [s["torch_in_node"] for s in all_stats],
        "rss_mb_stream_per_node": [s["rss_mb_stream"] for s in all_stats],
        "weight_bytes_per_node": [s["weight_bytes"] for s in all_stats],
        "messages_per_inference": int(sum(s["messages"] for s in all_stats)),
    }


def model_name(b: Any) -> str:
    """The model's name in the protocol: the export folder's (as Triton names a model by its folder)."""
    root = b.folder.parent if b.folder.name == f"rank{b.rank}" else b.folder
    return root.resolve().name


def run(a: argparse.Namespace) -> dict[str, Any] | None:
    """The whole life of one node; returns rank 0's report."""
    check_args(a)
    node = Node(a)
    if a.serve is not None:
        from .front import serve

        serve(node, a.serve, a.model_name or model_name(node.b), a.serve_token, a.max_queue, a.inflight,
              int(a.max_body_mb * 1e6), a.request_timeout)
        return None
    linger, lost = 2000, None
    try:
        node.start()
        node.fire("startup")
        if node.tr.serving:  # rank 0 serves requests: follow it until it ends the group
            from .follower import follow

            follow(node)
            return None
        err = node.self_test()
        done = node.serve()
        node.tr.flush()
        if a.rank != 0:
            node.tr.send_control(0, {"stats": node.stats()})
            node.tr.flush()  # through the pacer before the sockets close
            return None
        all_stats = [node.stats()] + [node.tr.control(j)["stats"] for j in range(1, a.nodes)]
        if done["served_err"] is not None:  # the worse of the self-test and the first served output
            err = max(err or 0.0, done["served_err"])
        return report(node, err, done["lat"], done["stream_s"], all_stats)
    except (Failed, Refused) as e:
        if node.tr is not None:
            node.tr.tell_stop(f"rank {a.rank}: {e}")
        linger, lost = 500, getattr(e, "peer", None)  # the stop notices get out; nothing waits for a lost peer
        raise
    finally:
        if node.tr is not None:
            node.tr.close(linger, lost)


def main(argv: list[str] | None = None) -> int:
    """Entry point (``disco-node`` / ``python -m disco_edge``): exit 0, 2 (refused) or 3 (failed)."""
    logging.basicConfig(level=os.environ.get("DISCO_LOG", "WARNING").upper(), format="%(name)s: %(message)s")
    a = parser().parse_args(argv)
    try:
        rep = run(a)
    except (Failed, Refused) as e:
        print(f"disco node {a.rank}: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except ImportError as e:
        print(f"disco node {a.rank}: error: {e.name or e} is not installed on this device: pip install "
              "disco-edge (numpy, onnxruntime, pyzmq)", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # an unexpected failure still ends in one line and exit 3
        print(f"disco node {a.rank}: error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    if rep is not None:
        text = json.dumps(rep)
        if a.result:
            Path(a.result).write_text(text)
        else:
            print(text)
    return 0
