"""Why a node stopped; the exit codes are those of ``disco.errors`` (2 refused, 3 failed)."""

from __future__ import annotations

EXIT_REFUSED = 2
EXIT_FAILED = 3


class Refused(ValueError):
    """Bad input (folder, manifest, hash, option, peer list, missing library): nothing was computed."""

    exit_code = EXIT_REFUSED


class Failed(RuntimeError):
    """A failure during the run: a lost peer, a bad message, a deadline, a wrong self-test answer."""

    exit_code = EXIT_FAILED


class PeerLost(Failed):
    """A peer vanished, stopped answering or reported its own failure (``peer``: its rank)."""

    def __init__(self, rank: int, why: str) -> None:
        super().__init__(f"lost rank {rank}: {why}")
        self.peer = rank


class Aborted(Failed):
    """Rank 0 abandoned the inference this node runs (a served group lost a peer): not this node's failure."""


class WrongAnswer(Failed):
    """The group's output of the shipped reference is not the reference's: never serve it."""
