"""Why a run stopped, as exception types; the exit code follows from the type, never from the message.

    RefusedError   bad input, shard, manifest or option: nothing was computed    exit 2
    RunFailure     a peer was lost, start-up did not complete, a deadline passed  exit 3
    Interrupted    SIGINT / SIGTERM to the launcher                               exit 130 / 143
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REFUSED = 2
EXIT_FAILED = 3


class RefusedError(ValueError):
    """Refused input (shard, manifest, input tensor, option value): nothing was computed."""

    exit_code = EXIT_REFUSED


class RunFailure(RuntimeError):
    """A failure during a run: a lost or silent peer, a start-up that did not complete."""

    exit_code = EXIT_FAILED


class Interrupted(RunFailure):
    """The launcher was asked to stop (SIGINT or SIGTERM); its nodes were ended."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}; all nodes were stopped")
        self.exit_code = 128 + signum


def exit_code(e: BaseException) -> int:
    """The process exit code for ``e``: 2 for refusals (any ``ValueError``), else 3."""
    code = getattr(e, "exit_code", None)
    if isinstance(code, int):
        return code
    return EXIT_REFUSED if isinstance(e, (ValueError, FileNotFoundError, KeyError)) else EXIT_FAILED
