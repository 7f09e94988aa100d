"""The shipped experiments' MNIST data: the IDX files when all four are there, else digits.
Its module reads them with numpy alone: these tests start no TensorFlow."""

from __future__ import annotations

import gzip
import importlib.util
import struct
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

_DATA = Path(__file__).parents[1] / "tfconfig_slurm" / "experiments" / "mnist_data.py"
_STEMS = {
    "train-images-idx3-ubyte": (2051, 3),
    "train-labels-idx1-ubyte": (2049, 3),
    "t10k-images-idx3-ubyte": (2051, 2),
    "t10k-labels-idx1-ubyte": (2049, 2),
}


@pytest.fixture
def mnist_data() -> ModuleType:
    # A fresh module each time: load_examples caches what it read.
    spec = importlib.util.spec_from_file_location("mnist_data_under_test", _DATA)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_idx(data_dir: Path, stem: str, zipped: bool) -> None:
    """A tiny IDX file as the MNIST site ships it: image i is all pixels i, label i is i."""
    magic, count = _STEMS[stem]
    if magic == 2051:
        header = struct.pack(">IIII", magic, count, 28, 28)
        body = np.repeat(np.arange(count, dtype=np.uint8), 28 * 28).tobytes()
    else:
        header = struct.pack(">II", magic, count)
        body = np.arange(count, dtype=np.uint8).tobytes()
    if zipped:
        (data_dir / f"{stem}.gz").write_bytes(gzip.compress(header + body))
    else:
        (data_dir / stem).write_bytes(header + body)


def test_reads_the_idx_files_plain_and_gzipped(mnist_data: ModuleType, tmp_path: Path) -> None:
    for number, stem in enumerate(_STEMS):
        _write_idx(tmp_path, stem, zipped=number % 2 == 0)
    images, labels = mnist_data.load_examples(str(tmp_path), True)
    assert images.shape == (3, 28, 28, 1)
    assert images.dtype == np.float32
    assert images[2, 5, 5, 0] == pytest.approx(2 / 255)
    assert labels.tolist() == [0, 1, 2]
    assert mnist_data.load_examples(str(tmp_path), False)[1].tolist() == [0, 1]


def test_an_incomplete_data_dir_is_refused_and_no_data_dir_trains_on_the_digits(
    mnist_data: ModuleType, tmp_path: Path
) -> None:
    """A newcomer's directory whose files were spelt otherwise trained on the digits, said only
    in a task's log: the job succeeded on other data than it was given."""
    for stem in list(_STEMS)[:3]:
        _write_idx(tmp_path, stem, zipped=False)
    with pytest.raises(ValueError, match=r"is \S+, which lacks t10k-labels-idx1-ubyte \(nor"):
        mnist_data.load_examples(str(tmp_path), True)
    with pytest.raises(ValueError, match=r"which lacks t10k-labels-idx1-ubyte"):
        mnist_data.check_data(str(tmp_path))
    train_images, _ = mnist_data.load_examples(None, True)
    test_images, test_labels = mnist_data.load_examples(None, False)
    assert (len(train_images), len(test_images)) == (1438, 359)
    assert set(test_labels.tolist()) == set(range(10))
    assert test_images.min() >= 0.0 and test_images.max() == 1.0


def test_kaggle_s_spelling_of_the_files_is_read(mnist_data: ModuleType, tmp_path: Path) -> None:
    for stem in _STEMS:
        _write_idx(tmp_path, stem, zipped=False)
        (tmp_path / stem).rename(tmp_path / stem.replace("-idx", ".idx"))
    assert mnist_data.load_examples(str(tmp_path), False)[1].tolist() == [0, 1]


def test_a_file_that_is_not_idx_is_named(mnist_data: ModuleType, tmp_path: Path) -> None:
    for stem in _STEMS:
        _write_idx(tmp_path, stem, zipped=False)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(b"<html>not found</html>")
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte is not an MNIST IDX file"):
        mnist_data.load_examples(str(tmp_path), True)


def test_a_resumed_run_s_batches_go_on_from_its_step(mnist_data: ModuleType) -> None:
    """#52: a run resumed at global step k reads what a run from the start reads from its k-th
    batch on, across passes, where every resume read the first pass's order again; each
    trainer's order is its own."""
    params = {"batch_size": 100, "data_dir": None, "trainer_index": 1, "num_trainers": 2}
    # 719 examples in trainer 1's share: 7 batches a pass.

    def labels(global_step: int, count: int, **more: int) -> list[list[int]]:
        batches = mnist_data.batches({**params, **more, "global_step": global_step}, training=True)
        return [next(batches)[1].tolist() for _ in range(count)]

    from_start = labels(0, 20)
    assert labels(5, 15) == from_start[5:]
    assert labels(9, 11) == from_start[9:]
    assert labels(9, 1) != labels(0, 1)
    # Each pass in an order of its own.
    assert from_start[:7] != from_start[7:14]
    assert labels(0, 7, trainer_index=0) != from_start[:7]


def test_a_batch_larger_than_a_trainer_s_share_is_refused_as_it_is_asked_for(
    mnist_data: ModuleType,
) -> None:
    """#55: a shard smaller than one batch made none, and a fit waiting for one spun for ever."""
    params = {"batch_size": 1000, "data_dir": None, "trainer_index": 0, "num_trainers": 2}
    with pytest.raises(ValueError, match=r"batch_size'\] is 1000, more than this trainer's share"):
        mnist_data.batches(params, training=True)
    assert len(next(mnist_data.batches({**params, "num_trainers": 1}, training=True))[1]) == 1000
