"""Data-parallel training (DistributedDataParallel over gloo, 2 CPU processes).

- sparsify on 2 ranks: the kept links and the final weights are identical on both ranks (Taylor
  scores, computed from each rank's own data, would differ: rank 0's choice is broadcast);
- 2 ranks x batch B equal 1 process x batch 2B (same samples per step, a model without
  BatchNorm): final weights within rtol 1e-4 / atol 1e-6 (the order of the float sums differs);
- under torchrun, a killed rank ends the run (non-zero exit, no process left behind), the
  resumable state stays readable, and the same command resumes from it.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from test_imagefolder import make_image_folder
from torch import nn

from disco import distributed as D
from disco.cli import main

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, args, nprocs=2, timeout=300):
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    t0 = time.monotonic()
    while not ctx.join(timeout=5):
        if time.monotonic() - t0 > timeout:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"distributed workers did not finish within {timeout}s")


def _init(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    D.attach()


def _sparsify_worker(rank, port, dense, data, out, dump):
    from disco.sparsify.run import SparsifyConfig, sparsify

    _init(rank, port)
    cfg = SparsifyConfig(nodes=2, ratio=0.2, selection="taylor", epochs=2, batch_size=4, every=1, workers=0,
                         device="cpu", lr=0.05)
    res, dm = sparsify(dense, data, out, cfg, return_model=True)
    torch.save({"kept": dm.kept, "state": dm.state_dict(), "res": res}, Path(dump) / f"rank{rank}.pt")
    D.shutdown()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    return make_image_folder(tmp_path / "data")


def test_sparsify_two_ranks_keep_the_same_links(folder, tmp_path, capsys):
    dense = tmp_path / "dense.safetensors"
    assert main(["train", "--task", "imagefolder", "--data", str(folder), "--model", "cifar_resnet8",
                 "--image-size", "16", "--epochs", "1", "--batch-size", "8", "--workers", "0",
                 "--out", str(dense)]) == 0
    out = tmp_path / "sp.safetensors"
    _spawn(_sparsify_worker, (_free_port(), str(dense), str(folder), str(out), str(tmp_path)))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert (r0["kept"] == r1["kept"]).all() and 0 < r0["kept"].mean() < 1
    assert r0["state"].keys() == r1["state"].keys()
    for k in r0["state"]:
        assert torch.equal(r0["state"][k], r1["state"][k]), k
    assert r0["res"]["top1"] == r1["res"]["top1"] and r0["res"]["n"] == 9  # metrics reduced over ranks
    from disco.checkpoint import load_checkpoint

    ck = load_checkpoint(out)  # written once, by rank 0
    assert (ck.kept() == r0["kept"]).all()


class _Loader:
    """Batches in DistributedSampler order (the union of the ranks' batches is one batch of 1 process)."""

    def __init__(self, x, y, batch_size, rank, world):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.sampler = torch.utils.data.DistributedSampler(range(len(y)), world, rank, shuffle=True, seed=3)

    def set_epoch(self, e):
        self.sampler.set_epoch(e)

    def __len__(self):
        return -(-len(self.sampler) // self.batch_size)

    def __iter__(self):
        idx = torch.tensor(list(self.sampler))
        for i in range(0, len(idx), self.batch_size):
            j = idx[i:i + self.batch_size]
            yield self.x[j], self.y[j]


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 4, (32,), generator=g)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def _fit(model, loader):
    from disco.train import fit

    return fit(model, loader, F.cross_entropy, epochs=2, lr=0.1, weight_decay=5e-4, warmup_epochs=0.5,
               device="cpu")


def _batch_worker(rank, port, dump):
    _init(rank, port)
    x, y = _data()
    model = _net()
    hist = _fit(model, _Loader(x, y, 4, rank, 2))
    torch.save({"state": model.state_dict(), "hist": hist}, Path(dump) / f"b{rank}.pt")
    D.shutdown()


def test_two_ranks_batch_b_equal_one_process_batch_2b(tmp_path):
    x, y = _data()
    single = _net()
    hist = _fit(single, _Loader(x, y, 8, 0, 1))
    _spawn(_batch_worker, (_free_port(), str(tmp_path)))
    r0, r1 = (torch.load(tmp_path / f"b{r}.pt", weights_only=False) for r in (0, 1))
    moved = 0.0
    for k, v in single.state_dict().items():
        assert torch.equal(r0["state"][k], r1["state"][k]), k
        torch.testing.assert_close(r0["state"][k], v, rtol=1e-4, atol=1e-6)
        moved += (v - _net().state_dict()[k]).abs().sum().item()
    assert moved > 0.1  # training did change the weights
    assert [h["loss"] for h in r0["hist"]] == pytest.approx([h["loss"] for h in hist], rel=1e-4)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                out[int(p.name)] = int(fields[1])
    return out


def _descendants(pid: int) -> list[int]:
    parents, found, todo = _parents(), [], [pid]
    while todo:
        cur = todo.pop()
        kids = [c for c, pp in parents.items() if pp == cur]
        found += kids
        todo += kids
    return found


def _alive(pids: list[int]) -> list[int]:
    parents = _parents()
    return [p for p in pids if p in parents]


def _local_rank(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(b"LOCAL_RANK="):
            return e.split(b"=", 1)[1].decode()
    return None


def _torchrun(folder, out, epochs):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "disco.cli", "train", "--task", "imagefolder", "--data", str(folder), "--model", "cifar_resnet8",
            "--image-size", "16", "--epochs", str(epochs), "--batch-size", "2", "--workers", "0",
            "--threads", "1", "--out", str(out)]


def test_killed_rank_ends_the_run_and_the_state_resumes(folder, tmp_path):
    out = tmp_path / "x.safetensors"
    state = tmp_path / "x.safetensors.state.pt"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_torchrun(folder, out, 500), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    try:
        t0 = time.monotonic()
        while not state.is_file():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() - t0 < 240, "no epoch finished in 240 s"
            time.sleep(0.5)
        family = _descendants(proc.pid)
        ranks = {_local_rank(p): p for p in family}
        assert "1" in ranks, ranks
        os.kill(ranks["1"], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "Traceback" not in "\n".join(ln for ln in err.splitlines() if ln.startswith("disco"))
    assert "SIGKILL" in err or "exitcode" in err or "died" in err, err[-2000:]
    deadline = time.monotonic() + 20
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _alive(family) == [], "processes of the killed run are still alive"
    st = torch.load(state, weights_only=False)  # the resumable state survived, readable
    done = st["epoch"]
    assert done >= 1 and not out.exists()
    r = subprocess.run(_torchrun(folder, out, done + 1), capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    from disco.checkpoint import load_checkpoint

    hist = load_checkpoint(out).info["history"]
    assert [h["epoch"] for h in hist] == list(range(1, done + 2))  # resumed, not restarted
