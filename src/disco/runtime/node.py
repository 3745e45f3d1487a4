"""The node program: one process per node, the same under ``disco run`` and under torchrun.

    python -m disco.runtime.node DIR [--codec fp16] [--bandwidth 100mbit --latency 2ms] ...

Rendezvous through the environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as torchrun
sets it; ``--rank/--world-size/--master-addr/--master-port`` override it. The nodes of one run
share a token (``DISCO_RUN_TOKEN``: the launcher draws one per run; under torchrun export the
same value on every machine); every key they write lives under it, so a process without it
is never seen as a peer. Start-up (:mod:`.rendezvous`): every node joins a TCP store that listens
only on the given address (bounded by ``--startup-timeout``), loads and verifies its own shard and
the manifest (the leader also checks the input), and reports ready or the reason it refuses; only
when all N are ready, and agree on the export, does torch.distributed (gloo) start. Then, before
any input is served, the ranks run the export's reference input once (:mod:`.selftest`) and stop
when the output is not the shipped reference output.

Every blocking call has a deadline: store calls run under one, gloo under ``--timeout`` + 3 s, and
the watchdog ends every node with exit code 3 naming the lost rank. Exit codes come from the
exception type (:mod:`disco.errors`): 2 refused, 3 failed during the run. The report
(:mod:`.report`) gives each node's own peak memory and whether torch was loaded in it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ..errors import EXIT_FAILED, RefusedError, RunFailure, exit_code
from . import hooks
from .options import RunOptions
from .rendezvous import DeadlineStore, Identity, Watchdog, agree, die, publish, wait_keys

log = logging.getLogger("disco.node")

GLOO_SLACK_S = 3.0  # gloo's own deadline is later than the watchdog's, so the watchdog names the lost rank


def build_parser() -> argparse.ArgumentParser:
    """The node program's command line: the export, the rendezvous overrides and the run options."""
    p = argparse.ArgumentParser(prog="python -m disco.runtime.node", description="one DISCO node")
    p.add_argument("dir", help="export directory (manifest.json + node shards)")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--master-addr", default=None)
    p.add_argument("--master-port", type=int, default=None)
    RunOptions.add_arguments(p)
    p.add_argument("--result", help="the leader writes its JSON report here")
    return p


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Options shared by the node program and ``disco run`` (the fields of :class:`RunOptions`)."""
    RunOptions.add_arguments(p)


# ---- start-up -----------------------------------------------------------------------------

@dataclass
class Prepared:
    """What a node verified before any compute: the manifest, its shard, the codec; on rank 0 also the
    input it serves (with the reference outputs when it is the export's probe) and the self-test probe."""

    man: dict[str, Any]
    state: Any
    codec: Any
    x: torch.Tensor | None = None
    ref: dict[str, torch.Tensor] | None = None
    probe: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None


def _prepare(d: Path, opts: RunOptions, ident: Identity) -> Prepared:
    """Read and verify the manifest and this node's shard (the leader: also the input and the reference)."""
    from .export import load_node, read_manifest
    from .inputs import load_input, load_reference
    from .transport import get_codec

    man = read_manifest(d)
    state = load_node(d, ident.rank, ident.world)
    try:
        codec = get_codec(opts.codec or man["codec"])
    except ValueError as e:
        raise RefusedError(str(e)) from None
    prep = Prepared(man, state, codec)
    if ident.rank == 0:
        prep.x, prep.ref = load_input(opts.input, man, d)
        prep.probe = (prep.x, prep.ref) if prep.ref is not None else load_reference(man, d)
    elif opts.input_at == "every-node":  # the same input as the leader's, read here (served after the self-test)
        prep.x, _ = load_input(opts.input, man, d)
    return prep


def _start(d: Path, opts: RunOptions, ident: Identity) -> tuple[DeadlineStore, Prepared]:
    """Join the store, wait for every node, verify this node's part and agree with the others."""
    rank, world = ident.rank, ident.world
    store = ident.connect(opts.startup_timeout, max(opts.startup_timeout, opts.timeout), serve=True)
    store.set(f"joined/{rank}", "1")
    hooks.fire("startup", rank=rank)
    wait_keys(store, [f"joined/{r}" for r in range(world)], opts.startup_timeout, "start-up")
    prep = None
    try:  # load and verify before any compute; tell the others why we refuse
        prep = _prepare(d, opts, ident)
        status: dict[str, Any] = {"ok": True, "model_hash": prep.man["model_hash"],
                                  "fingerprint": prep.man["fingerprint"],
                                  "manifest_hash": prep.man.get("manifest_hash")}
    except Exception as e:
        status = {"ok": False, "why": str(e) or type(e).__name__, "refused": isinstance(e, ValueError)}
    agree(store, ident, status, opts.startup_timeout)
    if prep is None:  # agree() has raised already: every node heard why
        raise RefusedError(status["why"])
    return store, prep


@dataclass
class Wired:
    """A node ready to compute: its watchdog, link model, transport and executor."""

    wd: Watchdog
    link: Any
    tr: Any
    ex: Any


def _wire(opts: RunOptions, ident: Identity, prep: Prepared, store: DeadlineStore) -> Wired:
    """Start gloo and the watchdog; build the transport and the executor of this rank's plan."""
    import torch.distributed as dist

    from .executor import Executor
    from .transport import DistTransport, LinkModel, lower_io_threads, parse_bandwidth, parse_latency

    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store.store), rank=ident.rank,
                            world_size=ident.world, timeout=timedelta(seconds=opts.timeout + GLOO_SLACK_S))
    lower_io_threads(opts.io_nice)
    wd = Watchdog(ident.connect(opts.startup_timeout, opts.timeout), ident.rank, ident.world, opts.timeout)
    wd.start()
    part, plan = prep.state.part, prep.state.plan
    link = LinkModel(parse_bandwidth(opts.bandwidth), parse_latency(opts.latency))
    tr = DistTransport(ident.rank, ident.world, codec=prep.codec, link=link, n_links=part.n_links,
                       values_per_link=part.links.values, cdims={e.tag: e.cdim for e in plan.exchanges.values()})
    return Wired(wd, link, tr, Executor(plan, prep.state.gm, prep.state.weights, tr))


# ---- the run ------------------------------------------------------------------------------

def _serve(opts: RunOptions, rank: int, prep: Prepared, w: Wired, store: DeadlineStore) -> dict[str, Any]:
    """Self-test, the dataset pass, the timed inferences and the stream. A lost peer or a failed self-test
    ends the process at once (exit 3); any other error is published to the others, then raised."""
    from .evaluate import run_data
    from .report import timed
    from .selftest import self_test
    from .transport import PeerError

    try:
        err = self_test(w.ex, w.tr, store, rank, w.wd.world, prep.probe, opts.max_rel_err, opts.timeout)
        data_metrics = run_data(opts, prep.man, w.ex, store, rank) if opts.data else None
        w.tr.reset_counters()  # the report's byte counts are per inference
        if opts.input_at == "every-node":
            _same_input(store, rank, w.wd.world, prep.x, opts.timeout)
            w.ex.local_input = prep.x
        lat, first, per_inf, stream_s, rss = timed(opts, w.ex, w.tr, [prep.x] if rank == 0 else None, rank)
    except (PeerError, RunFailure) as e:
        w.wd.stop.set()
        die(rank, str(e), w.wd.store)
    except Exception as e:  # e.g. a refused data folder: tell the others, then exit with this error's code
        w.wd.stop.set()
        publish(w.wd.store, rank, f"{type(e).__name__}: {e}")
        raise
    extra = {"self_test_max_rel_err": err, **({"data": data_metrics} if data_metrics is not None else {})}
    return {"lat": lat, "first": first, "per_inf": per_inf, "stream_s": stream_s, "rss": rss, "extra": extra}


def _same_input(store: DeadlineStore, rank: int, world: int, x: torch.Tensor, timeout: float) -> None:
    """``--input-at every-node``: the leader checks that every node reads the input it reads (sha256), so that a
    node fed another input cannot make the split compute another function silently."""
    import hashlib

    digest = hashlib.sha256(x.detach().contiguous().numpy().tobytes()).hexdigest()
    store.set(f"input_sha/{rank}", digest)
    if rank != 0:
        return
    wait_keys(store, [f"input_sha/{r}" for r in range(world)], timeout, "the input check")
    other = [r for r in range(1, world) if store.get(f"input_sha/{r}").decode() != digest]
    if other:
        raise RunFailure(f"--input-at every-node: rank {', '.join(map(str, other))} reads another input than rank 0 "
                         "(every node must read the same input: the same --input file, or none)")


def _finish(opts: RunOptions, ident: Identity, prep: Prepared, w: Wired, store: DeadlineStore,
            run: dict[str, Any]) -> dict[str, Any] | None:
    """Publish this node's figures; the leader waits for every node and builds the report."""
    from .report import build_report, node_stats

    rank, world = ident.rank, ident.world
    w.tr.close()
    params = int(sum(s["params"] for s in prep.man["shards"] if s["rank"] == rank))
    stats = node_stats(rank, run["per_inf"], run["rss"], prep.state.weight_bytes, params)
    store.set(f"stats/{rank}", json.dumps(stats))
    if rank != 0:
        w.wd.stop.set()  # rank 0 may exit as soon as every node is done
    store.set(f"done/{rank}", "1")
    if rank != 0:
        return None
    wait_keys(store, [f"done/{r}" for r in range(world)], opts.timeout, "finishing")
    all_stats = [json.loads(store.get(f"stats/{r}")) for r in range(world)]
    return build_report(opts, prep.man, prep.codec, w.link, run["lat"], run["first"], prep.ref, run["stream_s"],
                        all_stats, run["extra"])


def run_node(d: str | Path, opts: RunOptions | None = None, rank: int | None = None, world: int | None = None,
             addr: str | None = None, port: int | None = None, result: str | None = None) -> dict[str, Any] | None:
    """Start-up, self-test, run, report. Returns the leader's report (None on other ranks).

    Raises :class:`RefusedError` (nothing computed) or :class:`RunFailure`; a lost peer or a failed
    self-test ends the process at once with exit code 3 (gloo may be blocked in another thread)."""
    import torch.distributed as dist

    opts = opts or RunOptions()
    ident = Identity.resolve(rank, world, addr, port)
    torch.set_num_threads(opts.threads)
    store, prep = _start(Path(d), opts, ident)
    w = _wire(opts, ident, prep, store)
    report = _finish(opts, ident, prep, w, store, _serve(opts, ident.rank, prep, w, store))
    if report is not None and result:
        Path(result).write_text(json.dumps(report))
    w.wd.stop.set()
    try:
        dist.destroy_process_group()
    except Exception:  # shutting down anyway
        pass
    return report


def main(argv: list[str] | None = None) -> int:
    """The node program: run one node, print the leader's report (or write it to ``--result``), exit."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rank = args.rank if args.rank is not None else os.environ.get("RANK", "?")
    try:
        hooks.install_from_env()
        report = run_node(args.dir, RunOptions.from_args(args), args.rank, args.world_size, args.master_addr,
                          args.master_port, args.result)
    except (RefusedError, RunFailure) as e:
        print(f"disco node {rank}: error: {e}", file=sys.stderr, flush=True)
        os._exit(exit_code(e))
    except Exception as e:  # gloo or the store failed outside a transfer
        text = str(e).strip()
        first = text.splitlines()[-1][:200] if text else ""
        lost = "lost rank 0 (the leader's store closed): " if "DistNetwork" in type(e).__name__ else ""
        print(f"disco node {rank}: error: {lost}{type(e).__name__}: {first}", file=sys.stderr, flush=True)
        os._exit(exit_code(e) if isinstance(e, ValueError) else EXIT_FAILED)
    if report is not None and not args.result:
        print(json.dumps(report))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown of gloo threads


if __name__ == "__main__":
    sys.exit(main())
