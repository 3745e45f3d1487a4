"""Why a command stopped, as exception types; the exit code follows from the type, never from the message.

Every layer (graph, checkpoint, validation, data, runtime) raises these; the command line and the node
program turn them into one line on stderr and an exit code:

    RefusedError        bad input, shard, manifest, checkpoint or option: nothing was computed   exit 2
      UnsupportedOpError  an op the partitioner cannot split (capture catches it apart)
      ShardError          a shard or manifest that does not verify (export catches it apart)
    RunFailure          a peer was lost, start-up did not complete, a deadline passed           exit 3
      PeerError           a transfer with a peer failed (the transport catches it apart)
      LaunchError         a node of a local launch failed or refused (carries every node's code)
      Interrupted         SIGINT / SIGTERM to the launcher                                  exit 130 / 143
"""

from __future__ import annotations

import signal

from disco_edge.errors import EXIT_FAILED, EXIT_REFUSED, Failed, PeerLost, Refused  # the torch-free engine's bases

EXIT_OK = 0

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_REFUSED", "Interrupted", "LaunchError", "PeerError", "RefusedError",
           "RunFailure", "ShardError", "UnsupportedOpError", "exit_code"]


class RefusedError(Refused):
    """Refused input (value, file, shard, manifest, checkpoint, dataset, model): nothing was computed."""


class UnsupportedOpError(RefusedError):
    """An op the partitioner has no rule for, or a use of an op that its rule does not support."""


class ShardError(RefusedError):
    """A node's shard or the manifest does not verify (another model, another N, a damaged file)."""


class RunFailure(Failed):
    """A failure during a run: a lost or silent peer, a start-up that did not complete, a wrong answer."""


class PeerError(RunFailure, PeerLost):
    """A peer died, closed its connection or stopped answering (``peer``: its rank)."""


class LaunchError(RunFailure):
    """A node of a local launch failed or refused. ``codes``: exit codes by rank; ``stderr``: the nodes' error
    output; ``exit_code``: 2 when a node refused (nothing was computed), else 3."""

    def __init__(self, msg: str, codes: list[int | None], stderr: list[str]) -> None:
        super().__init__(msg)
        self.codes, self.stderr = codes, stderr
        self.exit_code = EXIT_REFUSED if EXIT_REFUSED in codes else EXIT_FAILED


class Interrupted(RunFailure):
    """The launcher was asked to stop (SIGINT or SIGTERM); its nodes were ended."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}; all nodes were stopped")
        self.exit_code = 128 + signum


REFUSED_BUILTINS = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, KeyError)


def exit_code(e: BaseException) -> int:
    """The process exit code for ``e``: its own ``exit_code``, else 2 for refusals (a ``ValueError``, a missing
    or unreadable file, a ``KeyError``), else 3."""
    code = getattr(e, "exit_code", None)
    if isinstance(code, int):
        return code
    return EXIT_REFUSED if isinstance(e, REFUSED_BUILTINS) else EXIT_FAILED
