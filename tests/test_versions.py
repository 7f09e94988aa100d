"""versions.py: the runtimes' checks of what is installed, read without TensorFlow; and an
experiment's kind, read from its source (experiment.kind)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli import REPOSITORY
from tfconfig_slurm.cluster.role import ClusterRole
from tfconfig_slurm.errors import InstallError, UsageError
from tfconfig_slurm.process.supervision import supervise
from tfconfig_slurm.process.user_code import experiment, versions
from tfconfig_slurm.process.user_code.versions import Installed


@pytest.mark.parametrize(
    ("found", "problem"),
    [
        (Installed((3, 12), None, None), "needs TensorFlow 2.15, which this Python 3.12 does not"),
        (
            Installed((3, 12), "2.21.0", None),
            "needs TensorFlow 2.15, the last release with Estimator, and this Python 3.12 has "
            "TensorFlow 2.21.0",
        ),
        (Installed((3, 11), "2.16.0rc0", "2.15.0"), "has TensorFlow 2.16.0rc0"),
        (Installed((3, 11), "2.15.1", None), "needs tensorflow-estimator beside TensorFlow 2.15.1"),
    ],
)
def test_what_cannot_run_the_estimator_runtime_is_named(found: Installed, problem: str) -> None:
    with pytest.raises(InstallError) as raised:
        versions.require_estimator("--experiment=mnist_deep (Estimator)", found)
    assert raised.value.culprit == "--experiment=mnist_deep (Estimator)"
    assert problem in raised.value.problem
    assert "make venv (.venv)" in raised.value.hint and "'.[estimator]'" in raised.value.hint
    # Uncaught in a user's script, its traceback's last line carries the hint too.
    assert str(raised.value) == raised.value.one_line()
    assert str(raised.value).endswith(f"HINT: {raised.value.hint}")


@pytest.mark.parametrize("tensorflow", ["2.15.0", "2.15.1", "2.14.0"])
def test_tensorflow_2_15_and_older_with_the_estimator_can(tensorflow: str) -> None:
    versions.require_estimator("x", Installed((3, 11), tensorflow, "2.15.0"))


def test_this_estimator_environment_is_read_as_one() -> None:
    found = versions.installed()
    assert found.tensorflow is not None and found.tensorflow.startswith("2.15.")
    assert found.estimator is not None
    versions.require_estimator("x")


@pytest.mark.parametrize(
    ("found", "problem"),
    [
        (Installed((3, 11), "2.15.1", "2.15.0"), "this Python 3.11 has TensorFlow 2.15.1"),
        (Installed((3, 12), None, None), "this Python 3.12 has no TensorFlow"),
        (Installed((3, 12), "2.21.0", None, None), "needs tf-keras beside TensorFlow 2.21.0"),
        # #53: an experiment that imports tf_keras in the Keras 3 environment.
        (
            Installed((3, 12), None, None, None, "3.15.1", "0.12.0.1"),
            "this Python 3.12 has no TensorFlow, but Keras 3.15.1 on JAX, which trains an "
            "experiment that imports keras, not tf_keras",
        ),
    ],
)
def test_what_cannot_run_the_keras_runtime_is_named(found: Installed, problem: str) -> None:
    with pytest.raises(InstallError) as raised:
        versions.require_keras("--experiment=mnist_keras (Keras)", found)
    assert problem in raised.value.problem
    assert "make venv-tf2" in raised.value.hint and "'.[tf2]'" in raised.value.hint
    versions.require_keras("x", Installed((3, 12), "2.21.0", None, "2.21.0"))


def test_the_shipped_keras_experiment_in_the_keras_3_environment_is_sent_to_its_twin() -> None:
    """A newcomer's mnist_keras in .venv-keras3: the experiment is not theirs to edit."""
    on_jax = Installed((3, 12), None, None, None, "3.15.1", "0.12.0.1")
    with pytest.raises(InstallError) as raised:
        versions.require_keras("--experiment=mnist_keras (Keras)", on_jax, twin="mnist_keras3")
    assert raised.value.hint.startswith("--experiment=mnist_keras3 trains the same model on JAX")
    with pytest.raises(InstallError) as mine:
        versions.require_keras("--experiment=mine.py (Keras)", on_jax)
    assert mine.value.hint.startswith("import keras, not tf_keras, to train it on JAX here")


@pytest.mark.parametrize(
    ("found", "problem"),
    [
        (Installed((3, 12), None, None), "this Python 3.12 has no Keras"),
        (Installed((3, 11), "2.15.1", None, None, "2.15.0"), "this Python 3.11 has Keras 2.15.0"),
        (Installed((3, 12), None, None, None, "3.15.1"), "needs JAX beside Keras 3.15.1"),
        (Installed((3, 12), None, None, None, "3.15.1", "0.4.35"), "has JAX 0.4.35, which lacks"),
        (
            Installed((3, 12), None, None, None, "3.15.1", "0.8.1"),
            "needs JAX 0.8.2 or later, and this Python 3.12 has JAX 0.8.1, which lacks the "
            "option that turns its preemption service off (jax_enable_preemption_service)",
        ),
    ],
)
def test_what_cannot_run_the_keras_3_runtime_is_named(found: Installed, problem: str) -> None:
    with pytest.raises(InstallError) as raised:
        versions.require_keras3("--experiment=mnist_keras3 (Keras 3)", found)
    assert problem in raised.value.problem
    assert "make venv-keras3" in raised.value.hint and "'.[keras3]'" in raised.value.hint
    for jax in ("0.8.2", "0.11.2", "0.12.0.1", "0.13.0rc1"):
        versions.require_keras3("x", Installed((3, 12), None, None, None, "3.15.1", jax))


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("def model_fn(features, labels, mode, params): ...\ndef input_fn(mode, params): ...\n",
         "Estimator"),
        ("import keras\ndef build_model(params): ...\ndef dataset(mode, params): ...\n",
         "Keras 3"),
        ("from keras import layers\nfrom my_models import build_model, dataset\n", "Keras 3"),
        ("import keras\nimport tf_keras\ndef build_model(params): ...\n", "Keras"),
        ("import tf_keras as keras\ndef build_model(params): ...\n", "Keras"),
        ("def build_model(params): ...\ndef dataset(mode, params): ...\n", "Keras"),
        ("from my_models import build_model, dataset\n", "Keras"),
        ("build_model = make_builder()\n", "Keras"),
        ("try:\n    from tf_keras_models import build_model\nexcept ImportError:\n    pass\n",
         "Keras"),
        ("build_model: object = None\n", "Keras"),
        ("def helper():\n    def build_model(): ...\n", "Estimator"),
    ],
)  # fmt: skip
def test_an_experiment_s_kind_is_read_from_its_source(
    tmp_path: Path, source: str, kind: str
) -> None:
    path = tmp_path / "mine.py"
    path.write_text(source)
    assert experiment.kind(str(path)) == kind


@pytest.mark.parametrize(
    ("source", "hparams"),
    [
        ('HPARAMS = {"learning_rate": 1e-3, "units": 64}\n', {"learning_rate": 1e-3, "units": 64}),
        # Anything but one literal dict is the import's to tell.
        ("HPARAMS = dict(learning_rate=1e-3)\n", None),
        ('HPARAMS = {"learning_rate": 1e-3}\nHPARAMS["units"] = 64\n', None),
        ('HPARAMS = {"learning_rate": RATE}\n', None),
        ('HPARAMS = {"a": 1}\nfrom settings import HPARAMS\n', None),
        ('HPARAMS = {"a": 1}\nfrom settings import *\n', None),
        ('HPARAMS = {"a": 1}\nglobals()["HPARAMS"] = {}\n', None),
        # Not hashable: the import's error to give, not a traceback here.
        ("HPARAMS = {[1]: 2}\n", None),
        ("", None),
    ],
)
def test_literal_hparams_are_read_from_the_source_without_an_import(
    tmp_path: Path, source: str, hparams: dict[str, object] | None
) -> None:
    path = tmp_path / "mine.py"
    path.write_text(source)
    assert experiment.literal_hparams(str(path)) == hparams


def test_a_module_that_does_not_parse_is_its_syntax_error_not_a_kind(tmp_path: Path) -> None:
    """Not Estimator's kind by default: the wrong install would be named for a typo."""
    path = tmp_path / "mine.py"
    path.write_text("def model_fn(:\n")
    for read in (experiment.kind, experiment.literal_hparams):
        with pytest.raises(UsageError) as refused:
            read(str(path))
        assert refused.value.culprit == "--experiment"
        assert f"failed at {path}:1: SyntaxError" in refused.value.problem


def test_the_shipped_experiments_kinds() -> None:
    assert experiment.kind("mnist_deep") == experiment.ESTIMATOR
    assert experiment.kind("mnist_keras") == experiment.KERAS
    assert experiment.kind("mnist_keras3") == experiment.KERAS3


def test_a_failed_parameter_server_s_hint_follows_its_failure_and_the_tensorflow_installed() -> (
    None
):
    """A stock Estimator script on TensorFlow 2.21 fails on tf.estimator, and the hint named only
    MultiWorkerMirroredStrategy (a newcomer followed it, to no end); a script's own error (a
    newcomer's ValueError) was sent after --all_reduce too."""
    tf2, tf215 = (
        Installed((3, 12), "2.21.0", None, "2.21.0"),
        Installed((3, 11), "2.15.1", "2.15.0"),
    )
    no_estimator = (
        "its command failed: AttributeError: module 'tensorflow' has no attribute 'estimator'"
    )
    mirrored = "its command failed: ValueError: There is no id for task_type 'ps'"
    assert supervise._ps_failure_hint(tf2, no_estimator) == (
        "With TensorFlow 2.21.0 here, an Estimator script cannot run: Estimator needs "
        "TensorFlow 2.15"
    )
    for found in (tf2, tf215):
        assert supervise._ps_failure_hint(found, mirrored) == (
            "A script that trains with MultiWorkerMirroredStrategy fails beside a parameter "
            "server: run it under with-tfconfig --all_reduce"
        )
        assert supervise._ps_failure_hint(found, "its command failed: ValueError: boom") == ""
    ps = ClusterRole({"ps": ("a:1",), "worker": ("b:1",)}, "ps", 0)
    assert supervise._server_failure_hint(ps, mirrored).startswith(" A script that trains")
    worker = ClusterRole({"ps": ("a:1",), "worker": ("b:1",)}, "worker", 0)
    assert supervise._server_failure_hint(worker, mirrored) == ""


def test_the_cluster_resolver_without_tensorflow_names_what_to_install() -> None:
    with pytest.raises(InstallError) as raised:
        versions.require_tensorflow(
            "tfconfig_slurm.cluster_resolver", Installed((3, 12), None, None)
        )
    assert raised.value.one_line().startswith(
        "tfconfig_slurm.cluster_resolver: needs TensorFlow, which this Python 3.12 does not have."
    )
    versions.require_tensorflow("x", Installed((3, 12), "2.21.0", None))


def test_the_oldest_jax_is_named_alike_where_it_is_installed_and_tested() -> None:
    """#54: the floor the runtime refuses below is setup.cfg's for every Keras 3 extra and the
    Makefile's OLDEST_JAX, which make test installs and runs the Keras 3 tests on."""
    oldest = ".".join(map(str, versions.OLDEST_JAX))
    setup = (REPOSITORY / "setup.cfg").read_text()
    floors = re.findall(r"^\s+jax(?:\[\w+\])? >= (\S+)$", setup, re.MULTILINE)
    assert floors == [oldest] * 4, floors
    makefile = (REPOSITORY / "Makefile").read_text()
    assert re.search(r"^OLDEST_JAX := (\S+)$", makefile, re.MULTILINE)[1] == oldest  # type: ignore[index]
