"""What every recipe shares: running one ``disco`` command and caching a step's JSON result."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def disco(*args: str, threads: int | None) -> dict:
    """Run one ``disco`` command (echoed with ``+``) and return its last JSON line."""
    cmd = [sys.executable, "-m", "disco.cli", *args, *(["--threads", str(threads)] if threads else [])]
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cached(path: Path, fn: Callable[[], dict], source: Path | None = None) -> dict:
    """``fn()``'s result, stored in ``path`` so that a rerun skips it (unless ``source`` is newer)."""
    if path.is_file() and (source is None or path.stat().st_mtime >= source.stat().st_mtime):
        return json.loads(path.read_text())
    res = fn()
    path.write_text(json.dumps(res))
    return res
