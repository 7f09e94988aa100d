"""`python -m tfconfig_slurm.tfconfig`: what it prints, and one line with exit 2 on bad input."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.cli import run_module
from tests.slurm_envs import captured, task_env

TFCONFIG = "tfconfig_slurm.tfconfig"


def test_prints_this_tasks_tf_config() -> None:
    result = run_module(TFCONFIG, environ=captured("cyclic_3x3_tpn3_gres2", "task-3"))
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert config["task"] == {"type": "chief", "index": 0}
    assert [address.split(":")[0] for address in config["cluster"]["ps"]] == [
        "node1",
        "node2",
        "node3",
    ]
    assert result.stderr == ""


def test_export_lines_evaluate_in_a_shell() -> None:
    result = run_module(TFCONFIG, "--export", environ=captured("block_3x3_gres2", "task-2"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [shlex.split(line)[1].split("=", 1)[0] for line in lines] == [
        "TF_CONFIG",
        "CUDA_VISIBLE_DEVICES",
        "TFCONFIG_SLURM_STEP_GPUS",
    ]
    assert json.loads(shlex.split(lines[0])[1].split("=", 1)[1])["task"] == {
        "type": "worker",
        "index": 0,
    }
    assert lines[1] == "export CUDA_VISIBLE_DEVICES=1"
    # The node's GPUs as SLURM gave step 0 of job 1, for commands run with these exports.
    assert lines[2] == "export TFCONFIG_SLURM_STEP_GPUS=1.0:0,1"


def test_export_of_a_ps_hides_every_gpu() -> None:
    result = run_module(TFCONFIG, "--export", environ=captured("block_3x3_gres2", "task-3"))
    assert result.stdout.splitlines()[1] == "export CUDA_VISIBLE_DEVICES=''"


def test_explain_inside_a_step() -> None:
    result = run_module(TFCONFIG, "--explain", environ=captured("block_3x3_gres2", "task-0"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("3 nodes, 9 tasks (block): 1 chief, 5 workers, 3 ps;")
    assert lines[1].split() == [
        "rank", "node", "local", "role", "index", "address:port", "gpus", "threads"
    ]  # fmt: skip
    assert lines[3].split()[:5] == ["1", "node1", "1", "chief", "0"]
    assert lines[3].split()[6] == "0"
    # SLURM's 3 CPUs of the node, shared by its 2 trainers; its ps keeps them all.
    assert [lines[row].split()[-1] for row in (2, 3, 4)] == ["3+3", "1+1", "1+1"]
    # What a lost task costs the layout (#39): the step's restart, its 9 tasks started again.
    said = " ".join(lines[12:])
    assert said.startswith(
        "A lost task (killed, out of memory, or a peer that stops answering) ends the step"
    )
    assert "a restart costs the 9 tasks' start and the training since that checkpoint" in said
    assert said.endswith(
        "A node cut off: in a job submitted with --no-kill, the step starts again on the nodes "
        "left, laid out for them; in any other, Slurm ends the job (NODE_FAIL), and it goes on "
        "after a requeue or in a new job, without the node. A trainer of the runtime that makes "
        "no step for its --hang_timeout (300 s by default, at least 10 times its slowest step) "
        "is hung: every thread's stack goes into its log, the hung one is named, not the peers "
        "waiting for it, and the step starts again as for a lost task, costing that timeout, "
        "10 s more and a restart; the same step hung again ends the job."
    )
    coordinated = run_module(
        TFCONFIG, "--explain", "--coordinator", environ=captured("block_3x3_gres2", "task-0")
    )
    assert (
        " ".join(coordinated.stdout.splitlines()).count(
            "A lost worker's command is started again on its port while the coordinator goes on"
        )
        == 1
    ), coordinated.stdout
    # One copy for the step: only rank 0 prints it.
    other = run_module(TFCONFIG, "--explain", environ=captured("block_3x3_gres2", "task-4"))
    assert other.returncode == 0, other.stderr
    assert other.stdout == ""


def test_explain_json_plans_from_flags() -> None:
    result = run_module(
        TFCONFIG,
        "--explain",
        "--json",
        "--nodelist=gpu[01-04]",
        "--ntasks_per_node=3",
        "--gpus_per_node=2",
        "--port_base=4000",
    )
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert len(records) == 12
    assert records[4] == {
        "rank": 4,
        "node": "gpu02",
        "local_id": 1,
        "role": "worker",
        "index": 1,
        "address": "gpu02:4001",
        "gpus": ["0"],
    }


def test_plan_defaults_to_one_trainer_per_gpu_plus_a_ps() -> None:
    result = run_module(
        TFCONFIG, "--explain", "--json", "--nodelist=gpu[01-02]", "--gpus_per_node=4"
    )
    records = json.loads(result.stdout)
    assert [record["role"] for record in records].count("ps") == 2
    assert len(records) == 10


def test_a_plan_s_idle_gpus_are_said_with_its_flags_not_a_job_s_sbatch_lines() -> None:
    result = run_module(
        TFCONFIG, "--explain", "--nodelist=gpu[01-02]", "--gpus_per_node=4",
        "--ntasks_per_node=2",
    )  # fmt: skip
    (warning,) = [line for line in result.stdout.splitlines() if line.startswith("(warning:")]
    assert "(gpu01: 1,2,3; gpu02: 1,2,3)" in warning, warning
    assert warning.endswith("HINT: one trainer per GPU: --ntasks_per_node=5)"), warning


def test_a_heterogeneous_plan_puts_the_parameter_servers_on_the_cpu_nodes() -> None:
    result = run_module(
        TFCONFIG, "--explain", "--nodelist=gpu[01-02]", "--gpus_per_node=2",
        "--cpu_nodelist=cpu01", "--cpu_ntasks_per_node=2", "--evaluator",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("3 nodes (1 CPU, for the parameter servers), 6 tasks")
    assert "2 GPUs per GPU node" in lines[0] and "idle" not in result.stdout
    rows = [line.split() for line in lines[2:8]]
    assert [(row[1], row[3], row[6]) for row in rows] == [
        ("cpu01", "ps", "-"),
        ("cpu01", "evaluator", "-"),
        ("gpu01", "chief", "0"),
        ("gpu01", "worker", "1"),
        ("gpu02", "worker", "0"),
        ("gpu02", "worker", "1"),
    ]


def test_flagfile(tmp_path: Path) -> None:
    flagfile = tmp_path / "layout.flags"
    flagfile.write_text("--ps_per_node=0\n--address_template={node}-ib0\n")
    environ = task_env(["node1", "node2"], [2, 2], 0, gpus="0,1")
    result = run_module(TFCONFIG, f"--flagfile={flagfile}", environ=environ)
    config = json.loads(result.stdout)
    assert config["task"] == {"type": "chief", "index": 0}
    assert "ps" not in config["cluster"]
    assert config["cluster"]["chief"][0].startswith("node1-ib0:")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("--port_base=high", "--port_base (in --flagfile={}): is 'high', expected a whole number"),
        ("--ps_per_nod=0", "--ps_per_nod (in --flagfile={}): is not a flag of tfconfig-slurm"),
        ("garbage line", "'garbage line' (in --flagfile={}): is not a flag"),
        ("--noall_reduce=1", "--noall_reduce (in --flagfile={}): is given a value ('1')"),
    ],
)
def test_a_bad_flag_in_a_flagfile_names_the_file(tmp_path: Path, line: str, said: str) -> None:
    flagfile = tmp_path / "layout.flags"
    flagfile.write_text(f"--address_template={{node}}-ib0\n{line}\n")
    result = run_module(TFCONFIG, f"--flagfile={flagfile}", environ=BLOCK_TASK_4)
    assert result.returncode == 2
    assert result.stderr.startswith("tfconfig-slurm: " + said.format(flagfile)), result.stderr
    assert result.stderr.count("\n") == 1
    # Given on the command line, beside the file, the flag is the command line's.
    result = run_module(TFCONFIG, f"--flagfile={flagfile}", line, environ=BLOCK_TASK_4)
    flag = said.split(" (", maxsplit=1)[0]
    assert result.stderr.startswith(f"tfconfig-slurm: {flag}:"), result.stderr


@pytest.mark.parametrize(
    ("line", "flag"),
    [
        # absl keeps a flag file's quotes: addresses would have been 'node1-ib0':port.
        ("--address_template='{node}-ib0'", "--address_template"),
        # A list flag's first and last items keep them too: "'ps" and "worker'" (absl reads
        # a list as CSV, whose double quotes make one item, refused as no role).
        ("--roles='ps,ps,ps,chief,worker,worker,worker,worker,worker'", "--roles"),
        # An int flag's value, which absl then refused as no whole number.
        ("--port_base='20000'", "--port_base"),
    ],
)
def test_a_value_in_shell_quotes_in_a_flagfile_is_refused(
    tmp_path: Path, line: str, flag: str
) -> None:
    flagfile = tmp_path / "layout.flags"
    flagfile.write_text(f"{line}\n")
    result = run_module(TFCONFIG, f"--flagfile={flagfile}", environ=BLOCK_TASK_4)
    value = line.partition("=")[2]
    assert result.returncode == 2
    assert result.stderr == (
        f"tfconfig-slurm: {flag} (in --flagfile={flagfile}): is {value}, its quotes included: "
        f"a flag file takes no shell quoting. HINT: write {flag}={value[1:-1]} there\n"
    )


def test_binary_flagfile(tmp_path: Path) -> None:
    flagfile = tmp_path / "layout.flags"
    flagfile.write_bytes(b"\xff\xfe--ps_per_node=0\n")
    result = run_module(TFCONFIG, f"--flagfile={flagfile}", environ=BLOCK_TASK_4)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("tfconfig-slurm: --flagfile: names a file that is not UTF-8")


@pytest.mark.parametrize("asked", ["--help", "--helpshort"])
def test_help_teaches(asked: str) -> None:
    """--helpshort is absl.app's name for it, which absl users type."""
    result = run_module(TFCONFIG, asked)
    assert result.returncode == 0, result.stderr
    assert "--explain --nodelist='gpu[01-04]'" in result.stdout
    assert "--flagfile: a text file of flags" in result.stdout
    for flag in ("--ps_per_node", "--roles", "--evaluator", "--address_template", "--port_base"):
        assert flag in result.stdout
    assert "--[no]all_reduce" in result.stdout and "--nodelist" in result.stdout


def test_the_commands_that_run_in_a_step_list_no_planning_flags() -> None:
    """They refuse --nodelist and its kin (tfconfig-slurm --explain's), so their help does not
    offer them."""
    for module in ("tfconfig_slurm.commands.with_tfconfig", "tfconfig_slurm.run"):
        result = run_module(module, "--help")
        assert result.returncode == 0
        assert "--[no]all_reduce" in result.stdout
        for flag in ("--nodelist", "--gpus_per_node", "--ntasks_per_node", "--distribution"):
            assert flag not in result.stdout, (module, flag)


def test_never_imports_tensorflow() -> None:
    """-X importtime lists every module the process imports, on stderr."""
    for arguments, environ in [
        (("--explain", "--nodelist=n[1-2]", "--gpus_per_node=2"), {}),
        (("--export",), captured("block_3x3_gres2", "task-4")),
    ]:
        result = run_module(
            TFCONFIG, *arguments, environ=environ, python_flags=("-X", "importtime")
        )
        assert result.returncode == 0
        imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
        assert "hostlist" in imported
        assert not any(
            name.split(".")[0] in ("tensorflow", "tensorflow_estimator") for name in imported
        )


BLOCK_TASK_4 = captured("block_3x3_gres2", "task-4")


def _block_task_4_with(**changes: str) -> dict[str, str]:
    return BLOCK_TASK_4 | changes


def _block_task_4_without(*names: str) -> dict[str, str]:
    return {name: value for name, value in BLOCK_TASK_4.items() if name not in names}


def test_without_arguments_the_tf_config_is_the_flags_own_and_imports_no_flags() -> None:
    """What every task of a step runs skips absl's flags (a quarter of the command's time),
    and prints, warns and refuses exactly as the command given its default flags."""
    idle = task_env(["a", "b"], [3, 3], 4, gpus="0,1,2,3,4,5,6,7")
    said = {}
    for name, environ in (("step", BLOCK_TASK_4), ("idle", idle), ("outside", {})):
        bare = run_module(TFCONFIG, environ=environ, python_flags=("-X", "importtime"))
        flagged = run_module(TFCONFIG, "--ps_per_node=1", environ=environ)
        lines = [line for line in bare.stderr.splitlines() if not line.startswith("import time")]
        assert (bare.returncode, bare.stdout, lines) == (
            flagged.returncode, flagged.stdout, flagged.stderr.splitlines()
        )  # fmt: skip
        imported = {line.split("|")[-1].strip() for line in bare.stderr.splitlines()}
        assert "hostlist" in imported and not any(module.startswith("absl") for module in imported)
        said[name] = (bare.returncode, flagged.stdout, flagged.stderr)
    assert said["step"][0] == 0 and json.loads(said["step"][1])["task"]["type"] == "worker"
    assert said["idle"][2].startswith("tfconfig-slurm: warning: GPUs idle on 2 of 2 nodes")
    assert said["outside"][0] == 2 and said["outside"][2].startswith("tfconfig-slurm: SLURM_JOB_ID")


MALFORMED = [
    # (case, arguments, environment, the culprit the line must name)
    ("outside SLURM", (), {}, "SLURM_JOB_ID"),
    ("batch shell", (), captured("array_1_a1", "batch"), "SLURM_STEP_ID"),
    ("rank missing", (), _block_task_4_without("SLURM_PROCID"), "SLURM_PROCID"),
    ("rank garbled", (), _block_task_4_with(SLURM_PROCID="four"), "SLURM_PROCID"),
    ("rank negative", (), _block_task_4_with(SLURM_PROCID="-1"), "SLURM_PROCID"),
    ("rank out of range", (), _block_task_4_with(SLURM_PROCID="9"), "SLURM_PROCID"),
    ("rank in other digits", (), _block_task_4_with(SLURM_PROCID="\u00b2"), "SLURM_PROCID"),
    ("job id of 5000 digits", (), _block_task_4_with(SLURM_JOB_ID="9" * 5000), "SLURM_JOB_ID"),
    ("node id missing", (), _block_task_4_without("SLURM_NODEID"), "SLURM_NODEID"),
    ("node id out of range", (), _block_task_4_with(SLURM_NODEID="3"), "SLURM_NODEID"),
    ("node id disagrees", (), _block_task_4_with(SLURM_NODEID="2"), "SLURM_NODEID"),
    ("local id disagrees", (), _block_task_4_with(SLURM_LOCALID="2"), "SLURM_LOCALID"),
    ("node name disagrees", (), _block_task_4_with(SLURMD_NODENAME="node3"), "SLURMD_NODENAME"),
    (
        "hostlist unbalanced",
        (),
        _block_task_4_with(SLURM_STEP_NODELIST="node[1-3"),
        "SLURM_STEP_NODELIST",
    ),
    ("hostlist empty", (), _block_task_4_with(SLURM_STEP_NODELIST=""), "SLURM_STEP_NODELIST"),
    (
        "hostlist repeats a node",
        (),
        _block_task_4_with(SLURM_STEP_NODELIST="node1,node2,node1"),
        "SLURM_STEP_NODELIST",
    ),
    (
        "fewer nodes than counts",
        (),
        _block_task_4_with(SLURM_STEP_NODELIST="node[1-2]"),
        "SLURM_STEP_TASKS_PER_NODE",
    ),
    (
        "tasks per node garbled",
        (),
        _block_task_4_with(SLURM_STEP_TASKS_PER_NODE="3(x3"),
        "SLURM_STEP_TASKS_PER_NODE",
    ),
    (
        "node without tasks",
        (),
        _block_task_4_with(SLURM_STEP_TASKS_PER_NODE="3,0,6"),
        "SLURM_STEP_TASKS_PER_NODE",
    ),
    (
        "task count disagrees",
        (),
        _block_task_4_with(SLURM_STEP_NUM_TASKS="8"),
        "SLURM_STEP_NUM_TASKS",
    ),
    (
        "task count missing",
        (),
        _block_task_4_without("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
        "SLURM_STEP_NUM_TASKS or SLURM_NTASKS",
    ),
    ("job id garbled", (), _block_task_4_with(SLURM_JOB_ID="12a"), "SLURM_JOB_ID"),
    (
        "restart count garbled",
        (),
        _block_task_4_with(SLURM_RESTART_COUNT="x"),
        "SLURM_RESTART_COUNT",
    ),
    ("plane distribution", (), captured("plane_2", "task-0"), "SLURM_DISTRIBUTION"),
    (
        "arbitrary distribution",
        (),
        _block_task_4_with(SLURM_DISTRIBUTION="arbitrary"),
        "SLURM_DISTRIBUTION",
    ),
    (
        "GPU list garbled",
        (),
        _block_task_4_with(CUDA_VISIBLE_DEVICES="0,,1"),
        "CUDA_VISIBLE_DEVICES",
    ),
    (
        "GPU listed twice",
        (),
        _block_task_4_with(CUDA_VISIBLE_DEVICES="1,1"),
        "CUDA_VISIBLE_DEVICES",
    ),
    ("GPUs bound per task", (), captured("gpus_per_task_2x2", "task-1"), "CUDA_VISIBLE_DEVICES"),
    # For the all-reduce layout too (with-tfconfig --keras3's): it lays out a node's GPUs itself.
    (
        "GPUs bound per task, all-reduce",
        ("--all_reduce",),
        captured("gpus_per_task_2x2", "task-1"),
        "CUDA_VISIBLE_DEVICES",
    ),
    ("GPUs hidden", (), _block_task_4_with(CUDA_VISIBLE_DEVICES=""), "CUDA_VISIBLE_DEVICES"),
    (
        "more GPUs than SLURM gave",
        (),
        _block_task_4_with(CUDA_VISIBLE_DEVICES="0,1,2,3"),
        "CUDA_VISIBLE_DEVICES",
    ),
    ("GPUs do not divide", (), task_env(["gpu01"], [4], 0, gpus="0,1"), "GPUs of node gpu01"),
    ("no trainer", ("--ps_per_node=3",), BLOCK_TASK_4, "--ps_per_node"),
    ("ps per node negative", ("--ps_per_node=-1",), BLOCK_TASK_4, "--ps_per_node"),
    ("ps per node not a number", ("--ps_per_node=x",), BLOCK_TASK_4, "--ps_per_node"),
    (
        "unknown role",
        ("--roles=ps,boss,worker,ps,worker,worker,ps,worker,worker",),
        BLOCK_TASK_4,
        "--roles",
    ),
    ("roles too short", ("--roles=ps,worker",), BLOCK_TASK_4, "--roles"),
    (
        "two chiefs",
        ("--roles=chief,chief,ps,worker,ps,worker,worker,ps,worker",),
        BLOCK_TASK_4,
        "--roles",
    ),
    (
        "address template field",
        ("--address_template={host}-ib0",),
        BLOCK_TASK_4,
        "--address_template",
    ),
    ("port base too low", ("--port_base=80",), BLOCK_TASK_4, "--port_base"),
    ("ports past 65535", ("--port_base=65534",), BLOCK_TASK_4, "--port_base"),
    (
        "a plan without its nodes",
        ("--explain", "--cpu_nodelist=cpu01"),
        {},
        "--cpu_nodelist: plans",
    ),
    (
        "CPU tasks without CPU nodes",
        ("--explain", "--nodelist=gpu[01-02]", "--cpu_ntasks_per_node=2"),
        {},
        "--cpu_ntasks_per_node: goes with --cpu_nodelist",
    ),
    (
        "unknown flag",
        ("--ps_per_nodes=1",),
        BLOCK_TASK_4,
        "--ps_per_nodes: is not a flag of tfconfig-slurm; did you mean --ps_per_node?",
    ),
    # absl takes one dash too: named as typed, where the user looks for it.
    ("unknown short flag", ("--explain", "-m"), {}, "tfconfig-slurm: -m: is not a flag of"),
    (
        "unknown flag close to two",
        ("--explain", "--gpu_per_node=2"),
        {},
        "--gpu_per_node: is not a flag of tfconfig-slurm; did you mean --gpus_per_node or "
        "--ps_per_node?",
    ),
    ("stray argument", ("explain",), BLOCK_TASK_4, "'explain'"),
    ("json without explain", ("--json",), BLOCK_TASK_4, "--json"),
    ("export and explain", ("--export", "--explain"), BLOCK_TASK_4, "--export"),
    ("plan without explain", ("--nodelist=n[1-2]",), {}, "--nodelist"),
    (
        "plan flag inside a step",
        ("--explain", "--gpus_per_node=2"),
        BLOCK_TASK_4,
        "--gpus_per_node",
    ),
    ("bad planned hostlist", ("--explain", "--nodelist=gpu[01-"), {}, "--nodelist"),
    (
        "cpu nodes among the gpu nodes",
        ("--explain", "--nodelist=gpu[01-02]", "--cpu_nodelist=gpu02"),
        {},
        "--cpu_nodelist",
    ),
    (
        "no planned task",
        ("--explain", "--nodelist=n1", "--ntasks_per_node=0"),
        {},
        "--ntasks_per_node",
    ),
    (
        # The default one ps a node fills the node the user gave one task.
        "a plan of only parameter servers by its tasks",
        ("--explain", "--nodelist=n1", "--ntasks_per_node=1"),
        {},
        "--ntasks_per_node: leaves no trainer among the step's 1 task, only parameter servers",
    ),
    (
        "a plan of only parameter servers by its servers",
        ("--explain", "--nodelist=n1", "--ntasks_per_node=2", "--ps_per_node=2"),
        {},
        "--ps_per_node: leaves no trainer among the step's 2 tasks",
    ),
    (
        "a plan too large by its parameter servers",
        ("--explain", "--nodelist=n[1-2]", "--ps_per_node=99999999999999999999"),
        {},
        "--ps_per_node: adds up to 200000000000000000000 tasks",
    ),
    (
        "a plan too large by its CPU nodes",
        ("--explain", "--nodelist=n1", "--cpu_nodelist=c[1-3]", "--cpu_ntasks_per_node=999999"),
        {},
        "--cpu_ntasks_per_node: adds up to",
    ),
    (
        "a plan too large by its nodes",
        ("--explain", "--nodelist=n[1-99999]", "--gpus_per_node=16"),
        {},
        "--nodelist: adds up to 1699983 tasks",
    ),
    (
        "unknown planned distribution",
        ("--explain", "--nodelist=n1", "--distribution=plane"),
        {},
        "--distribution",
    ),
    # A plan's hint names its flags, not the #SBATCH lines of a job.
    (
        "more trainers planned than GPUs",
        ("--explain", "--nodelist=gpu[01-02]", "--gpus_per_node=2", "--ntasks_per_node=5"),
        {},
        "HINT: one trainer per GPU: --ntasks_per_node=3; or --gpus_per_node=4",
    ),
    # absl raises a plain ValueError for the first, which came out as a traceback.
    (
        "negated boolean given a value",
        ("--explain", "--nodelist=n1", "--noall_reduce=1"),
        {},
        "--noall_reduce: is given a value ('1'), but it only turns --all_reduce off",
    ),
    ("flag without its value", ("--explain", "--nodelist"), {}, "--nodelist: is given no value"),
]


@pytest.mark.parametrize(
    ("arguments", "environ", "culprit"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_malformed_input_gives_one_line_and_exit_2(
    arguments: tuple[str, ...], environ: dict[str, str], culprit: str
) -> None:
    result = run_module(TFCONFIG, *arguments, environ=environ)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("tfconfig-slurm: ")
    assert culprit in result.stderr
    assert "HINT: " in result.stderr


@pytest.mark.parametrize(
    ("word", "said"),
    [
        ("run", "'run': is not a command of tfconfig-slurm; did you mean runs or srun? HINT: "),
        ("explain", "'explain': is not a command of tfconfig-slurm. HINT: "),
    ],
)
def test_a_word_first_that_is_no_command_is_refused_with_a_guess(word: str, said: str) -> None:
    result = run_module("tfconfig_slurm", word)  # python -m tfconfig_slurm: tfconfig-slurm
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"tfconfig-slurm: {said}"), result.stderr
    assert result.stderr.count("\n") == 1
