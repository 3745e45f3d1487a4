"""Every command line of README.md and of the docs pages in ``PAGES`` runs verbatim in a fresh clone.

The test reads the bash blocks as they are at test time, copies the tracked files (``git ls-files``)
into a temporary folder beside a link to ``../shared`` (as a clone next to the shared data would
be), and runs the ``disco`` lines in order, from that folder: the first through the installed console
script, the others through ``disco.cli.main`` with the line's argv.

Only shorter work is appended to a line (argparse keeps the last value): training commands
(``train``, ``sparsify``) get ``--limit 256 --epochs 1``, as the README says a quick try may do,
data runs (``eval``, ``run --data``) ``--limit 256`` and other ``run`` lines ``--warmup 1 --iters 3``.
A line repeated on a later page runs once. Set-up lines (venv, pip, pytest), templates with
placeholders (``DENSE_CHECKPOINT``) and the multi-machine ``torchrun`` lines are not run here:
``.ci/run`` runs the set-up lines in a real fresh clone.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
PAGES = ("README.md", "docs/usage.md", "docs/cli.md", "docs/selection.md", "docs/choosing-a-split.md")
QUICK_TRAIN = ["--limit", "256", "--epochs", "1"]
QUICK_DATA = ["--limit", "256"]
QUICK_RUN = ["--warmup", "1", "--iters", "3"]


def bash_lines(text: str) -> list[str]:
    """The command lines of the ```bash blocks: continuations joined, comments and blank lines dropped."""
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        cur = ""
        for raw in block.splitlines():
            line = raw.rstrip()
            if cur:
                cur += " " + line.strip()
            else:
                cur = line.strip()
            if cur.endswith("\\"):
                cur = cur[:-1].rstrip()
                continue
            cur = _strip_comment(cur)
            if cur:
                out.append(cur)
            cur = ""
    return out


def _strip_comment(line: str) -> str:
    try:
        return shlex.join(shlex.split(line, comments=True)) if "#" in line else line
    except ValueError:
        return line


def readme_commands(root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """(page, argv) of every ``disco`` command the pages show, in page order; set-up lines left out."""
    cmds: list[tuple[str, list[str]]] = []
    for page in PAGES:
        f = root / page
        if not f.is_file():
            continue
        for line in bash_lines(f.read_text()):
            for part in re.split(r"\s*&&\s*", line):
                argv = shlex.split(part)
                if not argv:
                    continue
                exe = Path(argv[0]).name
                if exe != "disco":
                    continue  # python3 -m venv, pip install, pytest, torchrun: set-up or several machines
                if any(re.fullmatch(r"[A-Z_]{2,}|/path/to/.*|\[.*", a) for a in argv):
                    continue  # a line with placeholders is a template, not a command
                cmds.append((page, argv))
    return cmds


def _quick(argv: list[str]) -> list[str]:
    sub = argv[1] if len(argv) > 1 else ""
    if sub in ("train", "sparsify"):
        return argv + QUICK_TRAIN
    if sub == "eval" or (sub == "run" and "--data" in argv):
        return argv + QUICK_DATA
    if sub == "run":
        return argv + QUICK_RUN
    return argv


def test_the_pages_have_commands():
    cmds = readme_commands()
    assert cmds, "README.md shows no disco command"
    assert any(a[1] == "demo" for _, a in cmds), "the README's first lines should run `disco demo`"


def test_bash_lines_parse():
    text = "x\n```bash\ndisco a --b 1 \\\n   --c 2   # note\n# only a comment\n.venv/bin/disco demo\n```\n"
    assert bash_lines(text) == ["disco a --b 1 --c 2", ".venv/bin/disco demo"]




@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "data" / "cifar10").is_dir(), reason="needs ../shared/data/cifar10")
@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_readme_commands_run_verbatim_in_a_clone(tmp_path, monkeypatch, capfd):
    """The first line (``.venv/bin/disco demo``) runs as its own process through the console script; the
    others run in this process through ``disco.cli.main`` with the same argv (what the ``disco`` script
    calls), which saves a PyTorch import per line; ``disco run`` still starts its nodes as processes."""
    from disco.cli import main

    clone = tmp_path / "clone"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in files.splitlines():
        src = ROOT / rel
        if src.is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / rel)
    (tmp_path / "shared").symlink_to(SHARED)  # ../shared, as beside a real clone
    venv = Path(sys.executable).parent.parent
    (clone / ".venv").symlink_to(venv)  # the set-up line's .venv (installed already)
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.chdir(clone)
    cmds = readme_commands(clone)
    assert cmds[0][1][1] == "demo" and any(a[1] == "train" for _, a in cmds)
    seen: set[tuple[str, ...]] = set()
    for i, (page, argv) in enumerate(cmds):
        shown = " ".join(argv)
        if tuple(argv) in seen:  # the same line on a later page (or section) does the same: run once
            continue
        seen.add(tuple(argv))
        if i == 0:
            exe = str(clone / argv[0]) if "/" in argv[0] else shutil.which("disco", path=env["PATH"])
            assert exe, "disco is not on PATH"
            p = subprocess.run([exe, *argv[1:]], cwd=clone, env=env, capture_output=True, text=True, timeout=1800)
            rc, err = p.returncode, p.stderr
        else:
            capfd.readouterr()
            rc = main(_quick(argv)[1:])
            err = capfd.readouterr().err
        assert rc == 0, f"{page}: `{shown}` exited {rc}:\n{err[-3000:]}"
        assert "Traceback" not in err, f"{page}: `{shown}` printed a traceback:\n{err[-3000:]}"
