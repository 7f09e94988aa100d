"""Property: every task of any consistent step computes the same cluster, and a sound one."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.slurm_envs import task_env
from tfconfig_slurm.cluster import LayoutPolicy, lay_out_step, read_slurm_step
from tfconfig_slurm.cluster.layout import EVALUATOR
from tfconfig_slurm.cluster.render import tf_config
from tfconfig_slurm.errors import LayoutError, TfconfigSlurmError

# Checking every rank of a 576-task step for each example would be slow; a sample of ranks
# (always with the first and the last) still shows any disagreement between tasks.
_RANKS_CHECKED = 12


@st.composite
def steps(draw: st.DrawFn) -> tuple[list[str], list[int], str, str, list[int], LayoutPolicy]:
    node_count = draw(st.integers(1, 64))
    order = draw(st.permutations(range(node_count)))
    nodes = [f"n{number}" for number in order]
    distribution = draw(st.sampled_from(["block", "cyclic"]))
    gpu_count = draw(st.integers(0, 8))
    gpu_ids = draw(
        st.lists(st.integers(0, 15), unique=True, min_size=gpu_count, max_size=gpu_count)
    )
    ps_per_node = draw(st.integers(0, 2))
    if gpu_count and draw(st.booleans()):
        # A step as users submit it: every node has ps plus at most one trainer per GPU.
        trainers = draw(st.integers(1, gpu_count))
        ps_per_node = min(ps_per_node, 9 - trainers)
        tasks_per_node = [ps_per_node + trainers] * node_count
    else:
        tasks_per_node = draw(st.lists(st.integers(1, 9), min_size=node_count, max_size=node_count))
    total = sum(tasks_per_node)
    ranks = sorted(
        {0, total - 1} | set(draw(st.lists(st.integers(0, total - 1), max_size=_RANKS_CHECKED)))
    )
    policy = LayoutPolicy(ps_per_node=ps_per_node, evaluator=draw(st.booleans()))
    return nodes, tasks_per_node, distribution, ",".join(map(str, gpu_ids)), ranks, policy


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_every_rank_computes_the_same_sound_cluster(
    step: tuple[list[str], list[int], str, str, list[int], LayoutPolicy],
) -> None:
    nodes, tasks_per_node, distribution, gpus, ranks, policy = step
    outcomes: list[object] = []
    for rank in ranks:
        environ = task_env(
            nodes, tasks_per_node, rank, distribution=distribution, gpus=gpus or None
        )
        try:
            layout = lay_out_step(read_slurm_step(environ), policy)
        except LayoutError as error:
            # A task names its own node where that is one whose GPUs do not fit its trainers.
            gpus_of_a_node = error.culprit.startswith("GPUs of node ")
            outcomes.append(("error", "GPUs of a node" if gpus_of_a_node else error.one_line()))
            continue
        outcomes.append(("cluster", layout.cluster()))
        own = layout.task(rank)
        config = tf_config(layout, rank)
        if own.role != "evaluator":
            assert config["cluster"][own.role][own.index] == own.address

        addresses = Counter(task.address for task in layout.tasks)
        assert max(addresses.values()) == 1
        assert len(config["cluster"]["chief"]) == 1
        for node in set(nodes):
            held = [gpu for task in layout.tasks if task.node == node for gpu in task.gpus]
            assert len(held) == len(set(held))
        assert all(not task.gpus for task in layout.tasks if task.role == "ps")
        # A trainer drives one GPU where the step has any; an evaluator takes one left free.
        assert all(
            len(task.gpus) == (1 if gpus else 0)
            for task in layout.tasks
            if task.role in ("chief", "worker")
        )
        assert all(len(task.gpus) <= 1 for task in layout.tasks)
    # Every rank, failing or not, reaches the same verdict: the same cluster, or a refusal of
    # the same setting.
    assert all(outcome == outcomes[0] for outcome in outcomes)


# Every variable the core reads, each either a plausible value, a mangled one, or absent.
_VARIABLES = {
    "SLURM_JOB_ID": ["17", "0", "-3", "x", ""],
    "SLURM_STEP_ID": ["0", "4294967294", "batch", ""],
    "SLURM_PROCID": ["0", "5", "99", "-1", "1.5", ""],
    "SLURM_NODEID": ["0", "1", "7", "a"],
    "SLURM_LOCALID": ["0", "2", "9", ""],
    "SLURMD_NODENAME": ["n1", "n2", "n10", "gpu[01-02]", ""],
    "SLURM_STEP_NODELIST": ["n[1-2]", "n1,n10", "n[2-1]", "n[1-", "", "n[1-100000]"],
    "SLURM_STEP_TASKS_PER_NODE": ["2(x2)", "3,1", "1(x0)", "2(x", "x", "", "4(x2),1"],
    "SLURM_STEP_NUM_TASKS": ["4", "0", "x", ""],
    "SLURM_DISTRIBUTION": ["block", "cyclic", "plane=2", "arbitrary", ""],
    "CUDA_VISIBLE_DEVICES": ["0,1", "", "0,0", "GPU-1f2e", "-1", "3"],
    "SLURM_GPUS_ON_NODE": ["2", "0", "x", ""],
}


@st.composite
def environments(draw: st.DrawFn) -> dict[str, str]:
    environ = {}
    for name, values in _VARIABLES.items():
        value = draw(st.one_of(st.none(), st.sampled_from(values), st.text(max_size=12)))
        if value is not None:
            environ[name] = value
    return environ


@settings(max_examples=400, deadline=None)
@given(environments(), st.integers(0, 2), st.booleans())
def test_any_slurm_environment_gives_a_cluster_or_one_of_our_errors(
    environ: dict[str, str], ps_per_node: int, evaluator: bool
) -> None:
    """However SLURM's variables are garbled, the core answers with a sound layout of the
    step SLURM described (every task placed once, this rank's TF_CONFIG naming it at its
    address) or with one of its own errors (a named culprit and a hint), never with a stray
    exception."""
    try:
        step = read_slurm_step(environ)
        layout = lay_out_step(step, LayoutPolicy(ps_per_node=ps_per_node, evaluator=evaluator))
        config = tf_config(layout, step.rank)
    except TfconfigSlurmError as error:
        assert error.culprit and error.hint
        return
    assert len(layout.roles) == step.shape.num_tasks == sum(step.shape.tasks_per_node)
    assert len(set(layout.addresses)) == len(layout.addresses)
    task = config["task"]
    assert (task["type"], task["index"]) == (layout.roles[step.rank], layout.indices[step.rank])
    if task["type"] != EVALUATOR:
        assert config["cluster"][task["type"]][task["index"]] == layout.addresses[step.rank]
    assert evaluator == (EVALUATOR in layout.roles)
