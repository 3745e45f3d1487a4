"""RunOptions (shared by launch and the node program), exit codes from exception types, the launcher's message."""

from __future__ import annotations

import sys

import pytest

from disco.errors import EXIT_FAILED, EXIT_REFUSED, Interrupted, RefusedError, RunFailure, exit_code
from disco.runtime.export import ShardError
from disco.runtime.launch import LaunchError, failure_message, node_command, node_reason
from disco.runtime.node import build_parser
from disco.runtime.options import RunOptions, run_options
from disco.runtime.transport import PeerError, lower_io_threads


def test_options_travel_to_the_node_program_unchanged() -> None:
    o = RunOptions(codec="fp16", bandwidth="100mbit", latency="2ms", limit=7, warmup=0, iters=5, stream=2,
                   input_at="every-node",
                   timeout=4.5, startup_timeout=6.0, threads=2, io_nice=5, max_rel_err=2e-3)
    cmd = node_command("d", 1, 2, 1234, o, result="/tmp/r.json")
    args = build_parser().parse_args(cmd[3:])
    assert RunOptions.from_args(args) == o
    assert (args.rank, args.world_size, args.master_port, args.result) == (1, 2, 1234, "/tmp/r.json")
    assert RunOptions().to_argv() == []  # defaults are not spelled out


def test_flag_lists_are_still_accepted_and_unknown_flags_refused() -> None:
    assert run_options(["--timeout", "3", "--codec", "int8"]) == RunOptions(timeout=3.0, codec="int8")
    with pytest.raises(RefusedError, match="--nope"):
        run_options(["--nope", "1"])


@pytest.mark.parametrize("kw, match", [({"codec": "fp8"}, "unknown codec 'fp8'"),
                                       ({"bandwidth": "fast"}, "cannot parse bandwidth"),
                                       ({"iters": 0}, "--iters must be at least 1"),
                                       ({"timeout": 0.0}, "--timeout must be a positive"),
                                       ({"io_nice": 20}, "--io-nice must be between 0 and 19"),
                                       ({"io_nice": -1}, "--io-nice must be between 0 and 19"),
                                       ({"input_at": "camera"}, "--input-at camera: choose leader or every-node"),
                                       ({"input_at": "every-node", "data": "d"}, "run it with --input-at leader")])
def test_bad_values_refused_before_start(kw: dict, match: str) -> None:
    with pytest.raises(RefusedError, match=match):
        RunOptions(**kw).check()


def test_exit_code_follows_the_type_not_the_words() -> None:
    assert exit_code(ShardError("this text says nothing")) == EXIT_REFUSED
    assert exit_code(RefusedError("input refused... lost rank 0")) == EXIT_REFUSED
    assert exit_code(PeerError(1, "refused connection")) == EXIT_FAILED  # 'refused' in the text: still 3
    assert exit_code(RunFailure("input")) == EXIT_FAILED
    assert exit_code(Interrupted(15)) == 143
    assert LaunchError("x", [2, 3], ["", ""]).exit_code == EXIT_REFUSED
    assert LaunchError("x", [3, -9], ["", ""]).exit_code == EXIT_FAILED


def test_reason_of_a_node_that_failed_outside_the_node_program() -> None:
    argparse_err = "usage: python -m disco.runtime.node ...\npython -m disco.runtime.node: error: argument " \
                   "--latency: bad\n"
    assert node_reason(argparse_err, 2).endswith("error: argument --latency: bad")
    assert node_reason("", -9) == "killed by SIGKILL"
    assert node_reason("", 3) == "exited with code 3"


def test_first_reason_first_and_each_reason_once() -> None:
    err = {0: "disco node 0: error: stopping: rank 2 reported: lost rank 1: no heartbeat for 4.0 s\n",
           1: "", 2: "disco node 2: error: lost rank 1: no heartbeat for 4.0 s\n"}
    msg = failure_message([2, 0], {0: 3, 1: -9, 2: 3}, err, {1: "stopped"})
    assert msg == "rank 2: lost rank 1: no heartbeat for 4.0 s; rank 1 (stopped) was ended by the launcher"


def test_a_reason_that_names_its_rank_is_not_prefixed_again() -> None:
    err = {0: "", 1: "disco node 1: error: rank 1 refused to start: shard node1.safetensors is damaged\n",
           10: "disco node 10: error: rank 1 is gone\n"}
    msg = failure_message([1, 10], {0: 3, 1: 2, 10: 2}, err, {})
    assert msg.startswith("rank 1 refused to start: shard node1.safetensors is damaged; rank 10: rank 1 is gone")


def test_a_stream_settles_its_sends() -> None:
    """The leader's sends are completed and dropped once their inference is back (bounded memory)."""
    from disco.runtime.transport import DistTransport

    class Work:
        waited = 0

        def wait(self) -> None:
            Work.waited += 1

    tr = DistTransport(0, 2)
    for k in range(5):
        tr._works.append((Work(), 1, bytes(k)))
    m = tr.mark()
    tr._works.append((Work(), 1, b""))
    tr.settle(m)
    assert len(tr._works) == 1 and Work.waited == 5 and tr.mark() == 6
    tr.settle(m)  # nothing more before that mark
    assert len(tr._works) == 1
    tr.flush()
    assert tr._works == [] and Work.waited == 6 and tr.mark() == 6


def test_gloo_errors_in_a_few_words() -> None:
    from disco.runtime.transport import gloo_reason

    e = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                     "[127.0.0.1]:9116. This is typically caused by a remote worker crashing. GLHF!\nmore")
    assert gloo_reason(e) == "RuntimeError: Connection closed by peer [127.0.0.1]:9116"
    assert node_reason("disco node 1: fault injection: SIGKILL at 1.0\n", -9) == "killed by SIGKILL"


def test_store_listens_only_on_the_given_address() -> None:
    from pathlib import Path

    from disco.runtime.launch import free_port
    from disco.runtime.rendezvous import tcp_store

    port = free_port()
    store = tcp_store("127.0.0.1", port, 1, 5.0, master=True)
    store.set("k", "v")
    listening = [ln.split()[1] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if ln.split()[3] == "0A" and ln.split()[1].endswith(f":{port:04X}")]
    six = [ln.split()[1] for ln in Path("/proc/net/tcp6").read_text().splitlines()[1:]
           if ln.split()[3] == "0A" and ln.split()[1].endswith(f":{port:04X}")] \
        if Path("/proc/net/tcp6").exists() else []
    assert listening == [f"0100007F:{port:04X}"] and six == []  # 127.0.0.1 only, not 0.0.0.0 or ::


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and niceness through /proc (Linux)")
def test_io_threads_lowered_and_nothing_else() -> None:
    """lower_io_threads finds gloo's I/O threads by their OS name and raises only their niceness."""
    import ctypes
    import os
    import threading

    ready, stop, tids = threading.Event(), threading.Event(), {}

    def named(name: bytes) -> None:  # an OS thread named like gloo's event loop (prctl PR_SET_NAME)
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)
        tids[name] = threading.get_native_id()
        if len(tids) == 2:
            ready.set()
        stop.wait(10)

    threads = [threading.Thread(target=named, args=(n,), daemon=True) for n in (b"gloo_tcp_loop", b"other")]
    for t in threads:
        t.start()
    try:
        assert ready.wait(5)
        before = os.getpriority(os.PRIO_PROCESS, tids[b"other"])
        assert lower_io_threads(0) == []  # 0: leave them alone
        assert tids[b"gloo_tcp_loop"] in lower_io_threads(19)  # (and any real gloo thread of this process)
        assert os.getpriority(os.PRIO_PROCESS, tids[b"gloo_tcp_loop"]) == 19
        assert os.getpriority(os.PRIO_PROCESS, tids[b"other"]) == before
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # the caller's own
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_every_node_input_check_names_a_rank_with_another_input() -> None:
    """The torch node's ``--input-at every-node`` check: the leader compares every rank's input digest with its own."""
    import torch

    from disco.runtime.node import _same_input

    class Store(dict):
        def set(self, k: str, v: str) -> None:
            self[k] = v.encode()

        def get(self, k: str) -> bytes:  # type: ignore[override]
            return self[k]

        def check(self, keys: list[str]) -> bool:
            return all(k in self for k in keys)

    x = torch.arange(12.0).reshape(1, 3, 2, 2)
    s = Store()
    for rank, v in ((2, x), (1, x + 1)):
        _same_input(s, rank, 3, v, 1.0)
    with pytest.raises(RunFailure, match="rank 1 reads another input than rank 0"):
        _same_input(s, 0, 3, x, 1.0)
    _same_input(s, 1, 3, x.clone(), 1.0)
    _same_input(s, 0, 3, x, 1.0)  # every rank the same: no error
