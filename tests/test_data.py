import pytest

from disco.data.cifar import CLASSES, CifarLoader, load_cifar10


@pytest.mark.data
def test_shared_cifar10_tar(cifar_dir):
    x, y = load_cifar10(cifar_dir, "test")
    assert x.shape == (10000, 32, 32, 3) and x.dtype.name == "uint8"
    assert sorted(set(y.tolist())) == list(range(10)) and (y == 3).sum() == 1000
    assert CLASSES[3] == "cat"


@pytest.mark.data
def test_loader_augments_train_only(cifar_dir):
    tr = CifarLoader(cifar_dir, "train", 64, train=True, limit=256)
    te = CifarLoader(cifar_dir, "test", 64, limit=256)
    (xa, ya), (xb, _) = next(iter(tr)), next(iter(te))
    assert xa.shape == (64, 3, 32, 32) and xb.shape == (64, 3, 32, 32)
    assert abs(xb.mean().item()) < 0.5  # normalised
    assert len(set(ya.tolist())) > 5  # the subset is class-balanced, not the first class folder


def test_bad_split(tmp_path):
    with pytest.raises(ValueError, match="split"):
        load_cifar10(tmp_path, "val")
