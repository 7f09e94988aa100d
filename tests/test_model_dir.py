"""The model directory's final export (process/records/history.py): a rerun that trains no
step exports nothing again, unless nothing was exported. No TensorFlow."""

from __future__ import annotations

from pathlib import Path

from tfconfig_slurm.process.records import history
from tfconfig_slurm.process.records.run_dir import RunDir


def test_a_run_exports_unless_it_trained_no_step_and_an_export_is_there(tmp_path: Path) -> None:
    exports = RunDir(tmp_path).export("mnist_keras")
    # Nothing exported yet: a rerun of a run killed in its final evaluation exports.
    assert history.export_due(tmp_path, "mnist_keras", trained=False)
    exports.mkdir(parents=True)
    assert history.export_due(tmp_path, "mnist_keras", trained=False)
    (exports / "1764201600").mkdir()
    assert not history.export_due(tmp_path, "mnist_keras", trained=False)
    # A run that trained exports its new model, and another experiment's exports are its own.
    assert history.export_due(tmp_path, "mnist_keras", trained=True)
    assert history.export_due(tmp_path, "mnist_keras3", trained=False)
