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


def test_python_batches_read_without_running_code(tmp_path):
    import pickle

    import numpy as np
    import pytest

    from disco.data.cifar import read_batch

    good = tmp_path / "test_batch"
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    good.write_bytes(pickle.dumps({b"data": data, b"labels": [3, 7]}, protocol=2))
    d = read_batch(good)
    assert d["labels"] == [3, 7] and np.array_equal(d["data"], data)

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "data_batch_1"
    bad.write_bytes(pickle.dumps({"data": Evil(), "labels": []}))
    with pytest.raises(ValueError, match=r"refused global (builtins|io)\.open"):
        read_batch(bad)
    assert not marker.exists()
