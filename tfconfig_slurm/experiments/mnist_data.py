"""The MNIST digits the shipped experiments train on, as numpy arrays (no TensorFlow here, for
the Keras 3 experiment on JAX; mnist_pipeline.py makes them datasets): the four MNIST IDX files
in `--data_dir`, else the 1797 handwritten digits of `digits.csv.gz` (E. Alpaydin and C.
Kaynak's test set of the UCI "Optical Recognition of Handwritten Digits", CC BY 4.0, as
scikit-learn ships it), scaled from 8x8 to 28x28, with a fixed split.
"""

from __future__ import annotations

import functools
import gzip
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from absl import logging

IMAGE_SIZE = 28
CLASSES = 10
_IDX_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_STEMS = tuple(stem for pair in _IDX_FILES.values() for stem in pair)
_IMAGES_MAGIC = 2051
_LABELS_MAGIC = 2049
_DIGITS_TEST_SHARE = 0.2
_DIGITS_SPLIT_SEED = 20170217
_DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")

Examples = tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]


def check_hparams(hparams: Mapping[str, Any]) -> None:
    """Refuses the shipped experiments' hparams they cannot train with (the runtime calls it
    before training, and says the ValueError's words in one line)."""
    if not 0 <= hparams["dropout"] < 1:
        raise ValueError(
            f"sets dropout={hparams['dropout']!r}, expected from 0 to below 1 (the share of the "
            "dense layer's units dropped each step)"
        )
    if hparams["learning_rate"] <= 0:
        raise ValueError(f"sets learning_rate={hparams['learning_rate']!r}, expected more than 0")
    if hparams.get("shuffle_buffer", 1) < 1:
        raise ValueError(
            f"sets shuffle_buffer={hparams['shuffle_buffer']!r}, expected 1 or more examples"
        )


def batches(params: Mapping[str, Any], *, training: bool) -> Iterator[Examples]:
    """Batches of (images, labels) as numpy arrays; for training, this trainer's shard
    (params["trainer_index"] of params["num_trainers"]), reshuffled each pass, endless, from
    params["global_step"]. A batch larger than the shard raises ValueError now: it would make
    none, and a fit waiting for one would spin for ever."""
    images, labels = load_examples(params.get("data_dir"), training)
    size = params["batch_size"]
    if not training:
        return (
            (images[start : start + size], labels[start : start + size])
            for start in range(0, len(labels), size)
        )
    trainer = params.get("trainer_index", 0)
    shard = slice(trainer, None, params.get("num_trainers", 1))
    images, labels = images[shard], labels[shard]
    if len(labels) < size:
        raise ValueError(
            f"params['batch_size'] is {size}, more than this trainer's share of the training "
            f"data ({len(labels)} examples, one in {params.get('num_trainers', 1)}), which then "
            "makes no batch"
        )
    return _training_batches(images, labels, size, trainer, params.get("global_step", 0))


def _training_batches(
    images: npt.NDArray[np.float32],
    labels: npt.NDArray[np.int32],
    size: int,
    trainer: int,
    global_step: int,
) -> Iterator[Examples]:
    # Whole batches only: a short last one would give the trainers unequal batches.
    per_pass = len(labels) // size
    # A run resumed at global step k goes on from its k-th batch (not the same batches again
    # at every resume): each pass's order is the trainer's and the pass's own.
    passes, skipped = divmod(global_step, per_pass)
    while True:
        shuffled = np.random.default_rng([trainer, passes]).permutation(len(labels))
        for start in range(skipped * size, per_pass * size, size):
            chosen = shuffled[start : start + size]
            yield images[chosen], labels[chosen]
        passes, skipped = passes + 1, 0


def check_data(data_dir: str) -> None:
    """Refuses a --data_dir without the four MNIST files (the runtime calls it before
    training, and says the ValueError's words in one line)."""
    _idx_files(data_dir)


@functools.cache
def load_examples(data_dir: str | None, training: bool) -> Examples:
    """Images as float32 [n, 28, 28, 1] in [0, 1] and labels as int32 [n]."""
    idx_files = _idx_files(data_dir)
    if idx_files is None:
        return _digits(training)
    images_path, labels_path = idx_files[training]
    images = _read_idx(images_path, _IMAGES_MAGIC).astype(np.float32) / 255.0
    return images[..., np.newaxis], _read_idx(labels_path, _LABELS_MAGIC).astype(np.int32)


@functools.cache
def _idx_files(data_dir: str | None) -> dict[bool, tuple[Path, Path]] | None:
    """The MNIST files of both splits, or None for the digits: decided once for both splits,
    so that a model is never trained on one data set and tested on the other."""
    found = {stem: path for stem in _IDX_STEMS if data_dir and (path := _idx_file(data_dir, stem))}
    missing = [stem for stem in _IDX_STEMS if stem not in found]
    if not missing:
        logging.info("mnist: reading the MNIST IDX files in %s", data_dir)
        return {
            split: (found[images], found[labels]) for split, (images, labels) in _IDX_FILES.items()
        }
    if data_dir:
        # Trained on the digits instead, a run would succeed on other data than it was given.
        raise ValueError(
            f"is {data_dir}, which lacks {', '.join(missing)} (nor .gz, nor with a dot before "
            "idx, as Kaggle's copy names them), so it holds no MNIST"
        )
    logging.info(
        "mnist: no --data_dir; using the 1797 handwritten digits that ship with tfconfig-slurm, "
        "scaled to 28x28 (1438 to train, 359 to test)"
    )
    return None


def _idx_file(data_dir: str, stem: str) -> Path | None:
    # MNIST's own names, and those of Kaggle's copy: train-images.idx3-ubyte.
    names = (stem, stem.replace("-idx", ".idx"))
    candidates = [Path(data_dir, name + suffix) for name in names for suffix in ("", ".gz")]
    return next((path for path in candidates if path.is_file()), None)


def _read_idx(path: Path, magic: int) -> npt.NDArray[np.uint8]:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    found_magic, count = struct.unpack(">II", data[:8])
    if found_magic != magic:
        raise ValueError(f"{path} is not an MNIST IDX file (magic {found_magic}, not {magic})")
    dimensions = (IMAGE_SIZE, IMAGE_SIZE) if magic == _IMAGES_MAGIC else ()
    header = 8 + 4 * len(dimensions)
    return np.frombuffer(data, np.uint8, offset=header).reshape((count, *dimensions))


def _digits(training: bool) -> Examples:
    # Not read from scikit-learn: installed, Keras 3 imports it and SciPy inside every
    # TensorFlow 2.16+ task's `import tensorflow`, which slows each start.
    digits = np.loadtxt(_DIGITS_FILE, delimiter=",")
    order = np.random.RandomState(_DIGITS_SPLIT_SEED).permutation(len(digits))
    test_count = int(len(order) * _DIGITS_TEST_SHARE)
    chosen = digits[order[test_count:] if training else order[:test_count]]
    # 8x8 pixels of 0-16 -> each pixel a 3x3 block (24x24), framed by 2 blank pixels, as
    # MNIST digits sit in a 20x20 box centred in 28x28.
    images = np.kron(chosen[:, :-1].reshape(-1, 8, 8) / 16.0, np.ones((3, 3))).astype(np.float32)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    return images[..., np.newaxis], chosen[:, -1].astype(np.int32)
