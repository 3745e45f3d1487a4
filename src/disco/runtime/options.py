"""``RunOptions``: the options of one run, shared by ``disco run``, :func:`launch` and the node program.

The launcher turns them into the node program's command line with :meth:`RunOptions.to_argv` and the node
program reads them back with :meth:`RunOptions.from_args`; both sides declare their arguments from the same
fields (:meth:`RunOptions.add_arguments`), so an option cannot be known to one side only.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import RefusedError

INPUT_AT = ("leader", "every-node")


def _opt(default: Any, help: str, type: Any = None) -> Any:  # noqa: A002 - argparse's word
    return field(default=default, metadata={"help": help, "type": type})


@dataclass
class RunOptions:
    """How to run an export: wire codec, emulated link, input, counts, deadlines."""

    codec: str | None = _opt(None, "wire codec: fp32 (default: the manifest's), fp16, bf16, int8", str)
    bandwidth: str | None = _opt(None, "emulated per-node link bandwidth, e.g. 100mbit (default: unshaped)", str)
    latency: str | None = _opt(None, "emulated one-way latency per message, e.g. 2ms", str)
    input: str | None = _opt(None, "input tensor file (.safetensors with 'input', .pt or .npy); default: the "
                             "export's probe input, checked against the single-process output", str)
    input_at: str = _opt("leader", "leader: rank 0 reads the input and sends it to the nodes that need it; "
                         "every-node: each node reads the same input itself (a camera that sends each frame to "
                         "every node), no input message after the self-test", str)
    data: str | None = _opt(None, "dataset folder: the leader also runs the task's test split through the split "
                            "model and reports its metric (e.g. top1)", str)
    limit: int | None = _opt(None, "with --data: only this many test inputs", int)
    warmup: int = _opt(3, "untimed inferences first", int)
    iters: int = _opt(20, "timed inferences", int)
    stream: int = _opt(0, "also measure throughput with this many inputs in flight", int)
    timeout: float = _opt(20.0, "seconds without a peer's heartbeat (or a reply) before giving up", float)
    startup_timeout: float = _opt(20.0, "seconds for all nodes to join", float)
    threads: int = _opt(1, "torch threads per node", int)
    io_nice: int = _opt(19, "niceness of gloo's I/O threads, 0 to 19 (0: as the node's own); a high one keeps "
                        "their polling off the cores the node computes on", int)
    max_rel_err: float | None = _opt(None, "largest relative error allowed against the single-process model: the "
                                     "start-up self-test on the export's reference input (default 1e-4, with the "
                                     "lossless fp32 codec whatever --codec says) and, for `disco run`, the run's "
                                     "output on it (default 1e-4 with fp32, unchecked with a lossy codec unless "
                                     "given); more exits with code 3", float)

    @classmethod
    def add_arguments(cls, p: argparse.ArgumentParser) -> None:
        """Declare every field as ``--name`` on ``p`` (the same flags on both sides of the launch)."""
        for f in dataclasses.fields(cls):
            p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=f.metadata["type"],
                           default=f.default, help=f.metadata["help"])

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> RunOptions:
        """The options parsed by a parser that :meth:`add_arguments` set up (other attributes are ignored)."""
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)})

    @classmethod
    def from_kwargs(cls, **kw: Any) -> RunOptions:
        """The options named as keywords (``None``: the default); an unknown name is a ``TypeError``."""
        known = [f.name for f in dataclasses.fields(cls)]
        bad = sorted(set(kw) - set(known))
        if bad:
            raise TypeError(f"unknown run option(s) {', '.join(bad)}; known: {', '.join(known)}")
        return cls(**{k: v for k, v in kw.items() if v is not None})

    @classmethod
    def from_argv(cls, argv: list[str]) -> RunOptions:
        """Parse node-program style flags (``["--codec", "fp16", ...]``); unknown flags are refused."""
        p = argparse.ArgumentParser(prog="run options", add_help=False, exit_on_error=False)
        cls.add_arguments(p)
        try:
            ns, rest = p.parse_known_args(argv)
        except argparse.ArgumentError as e:
            raise RefusedError(str(e)) from None
        if rest:
            raise RefusedError(f"unknown run options {rest}")
        return cls.from_args(ns)

    def to_argv(self) -> list[str]:
        """The node program's flags for these options (defaults left out)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None and v != f.default:
                out += ["--" + f.name.replace("_", "-"), str(v)]
        return out

    def replace(self, **changes: Any) -> RunOptions:
        return dataclasses.replace(self, **changes)

    def check(self) -> None:
        """Refuse values that cannot work, before any process starts (:class:`RefusedError`)."""
        from .transport import get_codec, parse_bandwidth, parse_latency

        try:
            if self.codec is not None:
                get_codec(self.codec)
            parse_bandwidth(self.bandwidth)
            parse_latency(self.latency)
        except ValueError as e:
            raise RefusedError(str(e)) from None
        for name, low in (("warmup", 0), ("iters", 1), ("stream", 0), ("threads", 1), ("limit", 1)):
            v = getattr(self, name)
            if v is not None and v < low:
                raise RefusedError(f"--{name} must be at least {low}, got {v}")
        if self.input_at not in INPUT_AT:
            raise RefusedError(f"--input-at {self.input_at}: choose {' or '.join(INPUT_AT)}")
        if self.input_at != "leader" and self.data is not None:
            raise RefusedError("--data feeds the test split from the leader: run it with --input-at leader")
        if self.max_rel_err is not None and not self.max_rel_err > 0:
            raise RefusedError(f"--max-rel-err must be a positive number, got {self.max_rel_err}")
        if not 0 <= self.io_nice <= 19:
            raise RefusedError(f"--io-nice must be between 0 and 19, got {self.io_nice}")
        for name in ("timeout", "startup_timeout"):
            v = getattr(self, name)
            if not v > 0:
                raise RefusedError(f"--{name.replace('_', '-')} must be a positive number of seconds, got {v}")


def run_options(opts: RunOptions | list[str] | tuple[str, ...] | None) -> RunOptions:
    """Accept a :class:`RunOptions`, a node-program flag list (older callers) or None (defaults)."""
    if opts is None:
        return RunOptions()
    if isinstance(opts, RunOptions):
        return opts
    return RunOptions.from_argv(list(opts))
