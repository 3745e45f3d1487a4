import numpy as np
import pytest
import torch

from disco.checkpoint import load_checkpoint
from disco.errors import RefusedError
from disco.graph import partition
from disco.loading import load, load_into, save_disco
from disco.masks import DiscoModel
from disco.models import build_model
from disco.sparsify import magnitude_scores, select_links


def _disco(name="cifar_resnet8", nodes=2, ratio=0.2, seed=0):
    torch.manual_seed(seed)
    model = build_model(name)
    part = partition(model, (1, 3, 32, 32), nodes)
    dm = DiscoModel(model, part)
    dm.set_kept(select_links(part, magnitude_scores(dm), ratio))
    return dm.eval()


@pytest.fixture
def saved(tmp_path):
    dm = _disco()
    path = save_disco(dm, tmp_path / "m.safetensors", {"name": "cifar_resnet8", "kwargs": {}}, task="cifar10",
                      info={"metrics": {"top1": 12.5}})
    return dm, path


def test_roundtrip_gives_the_same_function(saved):
    dm, path = saved
    loaded = load(path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), dm(x))
    assert (loaded.model.kept == dm.kept).all()
    assert loaded.ckpt.info["metrics"]["top1"] == 12.5 and loaded.ckpt.nodes == 2


def test_plain_weights_load_without_disco(saved):
    dm, path = saved
    from safetensors.torch import load_file

    plain = build_model("cifar_resnet8")
    plain.load_state_dict(load_file(str(path)))  # a torchvision-style state dict
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(plain.eval()(x), dm(x), atol=1e-6)


def test_refuses_another_n(saved):
    _, path = saved
    with pytest.raises(RefusedError, match="N=2 nodes; this model is split over N=3"):
        load_into(_disco(nodes=3), path, "cifar_resnet8")


def test_refuses_another_model(saved):
    _, path = saved
    with pytest.raises(RefusedError, match="holds model 'cifar_resnet8', not 'cifar_resnet20'"):
        load_into(_disco("cifar_resnet20"), path, "cifar_resnet20")
    with pytest.raises(RefusedError):
        load_into(_disco("cifar_resnet20"), path)  # no name given: the partition fingerprint differs


def test_load_into_restores_weights_and_links(saved):
    dm, path = saved
    other = _disco(seed=5, ratio=0.5)
    load_into(other, path, "cifar_resnet8")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(other(x), dm(x), atol=1e-6)


@pytest.mark.parametrize("where", ["header", "tensors", "truncated"])
def test_refuses_damaged_files(saved, where):
    _, path = saved
    raw = bytearray(path.read_bytes())
    if where == "header":
        raw[10:30] = b"\x00" * 20
    elif where == "tensors":
        raw[-100] ^= 0xFF
    else:
        raw = raw[: len(raw) // 2]
    path.write_bytes(bytes(raw))
    with pytest.raises(RefusedError, match="damaged|not a safetensors|not valid JSON"):
        load_checkpoint(path)


def test_refuses_foreign_safetensors(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(2)}, str(p))
    with pytest.raises(RefusedError, match="not a DISCO checkpoint"):
        load(p)
    with pytest.raises(RefusedError, match="does not exist"):
        load(tmp_path / "missing.safetensors")


def test_kept_bits_roundtrip():
    from disco.checkpoint import pack_bits, unpack_bits

    m = np.random.default_rng(0).random(1001) < 0.3
    assert (unpack_bits(pack_bits(m), 1001) == m).all()
