"""Every role's TF_CONFIG is read by the real `tf.estimator.RunConfig` as the layout means it."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from tests.slurm_envs import task_env
from tfconfig_slurm.cluster import LayoutPolicy, lay_out_step, read_slurm_step
from tfconfig_slurm.cluster.render import tf_config_json

NODES = ["n1", "n2"]


@pytest.fixture
def tf() -> ModuleType:
    """TensorFlow, imported by the tests that use it only: at collection, every pytest process
    (make check's eight workers too) would pay its import of 4-6 s."""
    tensorflow: ModuleType = pytest.importorskip("tensorflow")
    return tensorflow


@pytest.mark.parametrize(
    ("rank", "policy", "expected"),
    [
        # (task_type, task_id, num_ps_replicas, num_worker_replicas, is_chief)
        (1, LayoutPolicy(evaluator=True), ("chief", 0, 2, 3, True)),
        (0, LayoutPolicy(evaluator=True), ("ps", 0, 2, 3, False)),
        (3, LayoutPolicy(evaluator=True), ("ps", 1, 2, 3, False)),
        (4, LayoutPolicy(evaluator=True), ("worker", 1, 2, 3, False)),
        (5, LayoutPolicy(evaluator=True), ("evaluator", 0, 0, 0, False)),
        (0, LayoutPolicy(ps_per_node=0), ("chief", 0, 0, 6, True)),
        (5, LayoutPolicy(ps_per_node=0), ("worker", 4, 0, 6, False)),
    ],
)
@pytest.mark.tensorflow
def test_run_config_reads_each_role(
    tf: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    rank: int,
    policy: LayoutPolicy,
    expected: tuple[str, int, int, int, bool],
) -> None:
    step = read_slurm_step(task_env(NODES, [3, 3], rank))
    monkeypatch.setenv("TF_CONFIG", tf_config_json(lay_out_step(step, policy), rank))
    config = tf.estimator.RunConfig()
    assert (
        config.task_type,
        config.task_id,
        config.num_ps_replicas,
        config.num_worker_replicas,
        config.is_chief,
    ) == expected


@pytest.mark.tensorflow
def test_a_users_estimator_remade_for_a_task_keeps_its_settings_and_takes_the_cluster(
    tf: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from tfconfig_slurm.backends.estimator import trainer  # noqa: PLC0415

    step = read_slurm_step(task_env(NODES, [2, 2], 3))
    layout = lay_out_step(step, LayoutPolicy())
    session = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3)
    user = tf.estimator.DNNClassifier(
        feature_columns=[tf.feature_column.numeric_column("x")],
        hidden_units=[4],
        config=tf.estimator.RunConfig(
            model_dir=str(tmp_path),
            save_checkpoints_steps=7,
            keep_checkpoint_max=2,
            session_config=session,
            tf_random_seed=11,
        ),
    )
    # Built before the runtime knew the task: no cluster. A TF_CONFIG left around is not read.
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["x:1"]}, "task": {}}')
    remade = trainer.for_task(user, json.loads(tf_config_json(layout, 3)))
    config = remade.config
    assert (config.task_type, config.task_id, config.num_ps_replicas) == ("worker", 0, 2)
    assert (config.save_checkpoints_steps, config.keep_checkpoint_max) == (7, 2)
    assert (config.tf_random_seed, config.model_dir) == (11, str(tmp_path))
    assert config.session_config.intra_op_parallelism_threads == 3
    assert config.experimental_max_worker_delay_secs == 0
    alone = trainer.for_task(user, None).config
    assert (alone.task_type, alone.num_ps_replicas, alone.is_chief) == ("worker", 0, True)
