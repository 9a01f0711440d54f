"""`python -m estimator_dist.manifest`: the TFJob it prints, and the usage errors it refuses.

Most tests call the program's `main` in this process with flags parsed into a
fresh `FlagValues` (the program defines no flag on absl's global ones); two run
it as the real subprocess. The printed YAML is read back with the Training
SDK's own deserializer into `KubeflowOrgV1TFJob`.
"""

import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from absl import flags

from estimator_dist import manifest
from estimator_dist.base import exit_codes
from estimator_dist.kubernetes import job_settings
from estimator_dist.report import cli
from tests import procs

NAME, IMAGE = "mnist", "registry.example.com/trainer:1.0"
DOC = pathlib.Path(procs.REPO) / "docs" / "kubernetes.md"
REMOTE = "--model_dir=gs://bucket/mnist"


def run(args, capsys):
    """Runs the program in this process; returns (exit code, stdout, stderr)."""
    flag_values = flags.FlagValues()
    manifest.define_flags(flag_values)
    parse = cli.make_flags_parser(manifest.PROGRAM, flag_values)
    try:
        code = manifest.main(parse([manifest.PROGRAM, *args]), flag_values)
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def job_args(*extra, workers=2, train=(REMOTE,)):
    return [f"--name={NAME}", f"--image={IMAGE}", f"--num_workers={workers}", *extra, "--", *train]


def deserialize(text):
    """The YAML read back as the SDK reads a TFJob from the API server."""
    from kubeflow.training import ApiClient
    from kubeflow.training.utils.utils import FakeResponse

    return ApiClient().deserialize(FakeResponse(yaml.safe_load(text)), "KubeflowOrgV1TFJob")


def generated(args, capsys):
    code, out, err = run(args, capsys)
    assert code == 0, err
    return deserialize(out), err


def test_the_yaml_deserialises_into_the_sdk_tfjob_with_every_field(capsys):
    train = (
        "--model_dir=/mnt/runs/mnist",
        "--train_steps=500",
        "--distribution_strategy=parameter_server",
    )
    args = job_args(
        "--evaluator",
        "--num_ps=1",
        "--namespace=team-a",
        "--pvc=shared-runs:/mnt/runs",
        "--env=GOOGLE_CLOUD_PROJECT=p1",
        "--label=team=vision",
        "--backoff_limit=5",
        "--ttl_secs_after_finished=600",
        workers=3,
        train=train,
    )
    job, err = generated(args, capsys)
    assert (job.api_version, job.kind) == ("kubeflow.org/v1", "TFJob")
    assert (job.metadata.name, job.metadata.namespace) == (NAME, "team-a")
    assert job.metadata.labels == {"team": "vision"}
    assert (job.spec.run_policy.backoff_limit, job.spec.run_policy.clean_pod_policy) == (5, "None")
    assert job.spec.run_policy.ttl_seconds_after_finished == 600
    assert list(job.spec.tf_replica_specs) == ["Chief", "Worker", "PS", "Evaluator"]
    for kind, spec in job.spec.tf_replica_specs.items():
        assert spec.restart_policy == "ExitCode", kind
        pod = spec.template.spec
        assert pod.termination_grace_period_seconds == 30
        assert [(v.name, v.persistent_volume_claim.claim_name) for v in pod.volumes] == [
            ("pvc-0", "shared-runs")
        ]
        (container,) = pod.containers
        assert (container.name, container.image) == ("tensorflow", IMAGE)
        assert container.command == ["python", "-m", "estimator_dist.train"]
        assert container.args == list(train)
        assert [(p.name, p.container_port) for p in container.ports] == [("tfjob-port", 2222)]
        assert {e.name: e.value for e in container.env} == {
            "PYTHONUNBUFFERED": "1",
            "GOOGLE_CLOUD_PROJECT": "p1",
        }
        assert [(m.name, m.mount_path) for m in container.volume_mounts] == [("pvc-0", "/mnt/runs")]
        assert container.resources.limits is None
        assert spec.template.metadata.annotations["sidecar.istio.io/inject"] == "false"
        assert spec.template.metadata.labels == {"team": "vision"}
    assert err == ""


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("evaluator", [False, True])
@pytest.mark.parametrize("num_ps", [0, 2])
def test_replica_counts(workers, evaluator, num_ps, capsys):
    extra = ["--evaluator" if evaluator else "--noevaluator"]
    train = [REMOTE]
    if num_ps:
        extra.append(f"--num_ps={num_ps}")
        train.append("--distribution_strategy=parameter_server")
    job, _ = generated(job_args(*extra, workers=workers, train=train), capsys)
    counts = {kind: spec.replicas for kind, spec in job.spec.tf_replica_specs.items()}
    expected = {"Chief": 1, "Worker": workers - 1, "PS": num_ps, "Evaluator": int(evaluator)}
    assert counts == {kind: n for kind, n in expected.items() if n}
    assert job.spec.run_policy.clean_pod_policy == ("None" if evaluator else "Running")


def test_gpus_limit_the_chief_and_workers_and_choose_nccl(capsys):
    job, err = generated(job_args("--gpus_per_worker=2", "--evaluator"), capsys)
    specs = job.spec.tf_replica_specs
    for kind in ("Chief", "Worker"):
        (container,) = specs[kind].template.spec.containers
        assert container.resources.limits == {"nvidia.com/gpu": "2"}
        assert container.args == [REMOTE, "--communication=NCCL"]
    assert specs["Evaluator"].template.spec.containers[0].resources.limits is None
    assert err == ""


@pytest.mark.parametrize("chosen", ["NCCL", "auto", "RING"])
def test_collectives_the_training_flags_chose_are_kept(chosen, capsys):
    train = (REMOTE, "--communication", chosen)
    job, err = generated(job_args("--gpus_per_worker=1", train=train), capsys)
    for spec in job.spec.tf_replica_specs.values():
        assert spec.template.spec.containers[0].args == list(train)
    if chosen == "RING":
        assert err.count("warning:") == 1 and "--communication=RING kept as chosen" in err
    else:
        assert err == ""


def test_parameter_servers_get_no_collectives(capsys):
    train = (REMOTE, "--distribution_strategy=parameter_server")
    job, _ = generated(job_args("--gpus_per_worker=1", "--num_ps=1", train=train), capsys)
    assert job.spec.tf_replica_specs["Chief"].template.spec.containers[0].args == list(train)


@pytest.mark.parametrize("grace, expected", [("10", 15), ("12.5", 18), ("25", 30)])
def test_the_grace_period_leaves_a_margin_over_the_preemption_grace(grace, expected, capsys):
    train = (REMOTE, f"--preemption_grace_secs={grace}")
    job, _ = generated(job_args("--evaluator", train=train), capsys)
    for spec in job.spec.tf_replica_specs.values():
        assert spec.template.spec.termination_grace_period_seconds == expected
    assert job_settings.GRACE_MARGIN_SECS == 5


def test_parameter_servers_with_an_evaluator_warn_about_pods_left_running(capsys):
    train = (REMOTE, "--distribution_strategy=parameter_server")
    _, err = generated(job_args("--evaluator", "--num_ps=1", train=train), capsys)
    assert err.count("warning:") == 1 and "--ttl_secs_after_finished" in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--name=MNIST", f"--image={IMAGE}", "--num_workers=2", "--", REMOTE],
            ["--name='MNIST'", "DNS-1035", "such as 'mnist-run1'"],
        ),
        (
            [f"--name={'a' * 60}", f"--image={IMAGE}", "--noevaluator", "--", REMOTE],
            ["is too long", "-worker-0", "use at most 54 characters"],
        ),
        (
            [f"--name={NAME}", "--num_workers=2", "--", REMOTE],
            ["--image=None", "must have a value", "Fix the flag"],
        ),
        (job_args(workers=0), ["--num_workers=0", "positive integer", "Fix the flag"]),
        (
            job_args(train=(REMOTE, "--train_step=5")),
            ["training flag after '--'", "'train_step'", "Did you mean: train_steps"],
        ),
        (
            job_args(train=("--model_dir=/tmp/mnist",)),
            ["--model_dir=/tmp/mnist", "under no shared volume", "--pvc=", "gs://"],
        ),
        (
            job_args("--pvc=runs:/mnt/runs", train=("--model_dir=/mnt/other",)),
            ["--model_dir=/mnt/other", "/mnt/runs (claim runs)", "--pvc="],
        ),
        (job_args(train=("--train_steps=5",)), ["set no --model_dir", "gs://"]),
        (job_args("--num_ps=2"), ["2 ps task(s)", "--distribution_strategy=parameter_server"]),
        (
            job_args(train=(REMOTE, "--distribution_strategy=parameter_server")),
            ["needs at least one ps task", "--num_ps"],
        ),
        (
            job_args(workers=3, train=(REMOTE, "--batch_size=64")),
            ["--batch_size=64", "3 replicas", "such as 63 or 66"],
        ),
        (job_args(train=(REMOTE, "extra")), ["positional arguments after '--'", "['extra']"]),
        (job_args("--pvc=runs"), ["--pvc=runs", "CLAIM:/mount/path"]),
        (job_args("--env=TF_CONFIG={}"), ["--env=TF_CONFIG", "or the manifest writes"]),
        (job_args("--label=team"), ["--label=team", "KEY=VALUE"]),
    ],
)
def test_usage_errors_exit_2_with_one_message(args, expected, capsys):
    code, out, err = run(args, capsys)
    assert code == exit_codes.USAGE, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"{manifest.PROGRAM}: error: "), err
    for fragment in expected:
        assert fragment in lines[0]


def test_a_missing_sdk_names_the_extra_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "kubeflow.training", None)
    code, out, err = run(job_args(), capsys)
    assert code == exit_codes.FAILURE and out == ""
    assert "pip install 'estimator-dist[kubernetes]'" in err


def test_the_operator_retries_exactly_the_codes_the_package_calls_retryable():
    # training-operator 1.9, pkg/util/train/train_util.go: IsRetryableExitCode is `code >= 128`.
    codes = {name: code for name, code in vars(exit_codes).items() if name.isupper()}
    codes = {name: code for name, code in codes.items() if isinstance(code, int) and code}
    assert codes["PREEMPTED"] == 155 and codes["USAGE"] == 2
    rows = DOC.read_text(encoding="utf-8").splitlines()
    for name, code in codes.items():
        retried = code >= 128
        assert retried == exit_codes.is_retryable(code), name
        (row,) = [line for line in rows if line.startswith(f"| {code} | {name} |")]
        assert row.endswith("| recreates the pod |" if retried else "| fails the job |"), row


def run_program(args, python_options=()):
    """Runs the program as a subprocess, its standard output and error apart."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")}
    command = [sys.executable, *python_options, "-m", manifest.PROGRAM, *args]
    return subprocess.run(
        command, cwd=procs.REPO, env=env, capture_output=True, text=True, timeout=150
    )


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_program_prints_only_the_tfjob_on_standard_output():
    result = run_program(job_args("--evaluator"))
    assert result.returncode == 0, procs.report(f"exited {result.returncode}", result.stderr)
    job = deserialize(result.stdout)
    assert list(job.spec.tf_replica_specs) == ["Chief", "Worker", "Evaluator"]
    assert f"{manifest.PROGRAM}:" not in result.stderr, result.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_program_exits_2_on_a_bad_training_flag():
    result = run_program(job_args(train=(REMOTE, "--batch_size=0")))
    assert result.returncode == exit_codes.USAGE, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"{manifest.PROGRAM}: error: training flag after '--'")


#: Top-level packages a manifest never needs: seconds of start-up and C++ lines on stderr.
HEAVY = ("tensorflow", "keras", "tensorflow_datasets", "tensorflow_estimator", "tf_keras")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_the_program_imports_no_tensorflow_and_writes_nothing_to_standard_error():
    # `-X importtime` lists every module imported on standard error, and nothing else may be
    # there; the training flags still go through every check (here the batch over 2 workers).
    train = (REMOTE, "--batch_size=64", "--data_dir=gs://bucket/data", "--num_gpus=0")
    result = run_program(job_args("--evaluator", train=train), ("-X", "importtime"))
    assert result.returncode == 0, procs.report(f"exited {result.returncode}", result.stderr)
    assert list(deserialize(result.stdout).spec.tf_replica_specs) == [
        "Chief",
        "Worker",
        "Evaluator",
    ]
    lines = result.stderr.splitlines()
    others = [line for line in lines if not line.startswith("import time:")]
    assert not others, others[:5]
    imported = {line.rpartition("|")[2].strip() for line in lines}
    heavy = sorted(name for name in imported if name.split(".")[0] in HEAVY)
    assert "estimator_dist.config.job" in imported and not heavy, heavy[:5]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_the_package_imports_no_sdk_until_it_builds_a_tfjob():
    code = (
        "import sys, estimator_dist.manifest, estimator_dist.kubernetes.tfjob\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('kubeflow', 'kubernetes')]\n"
        "assert not loaded, loaded"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=procs.REPO, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr


# --- a script or a module of a package on every replica ------------------------------

PROGRAM = ("--job-dir=gs://bucket/census", "--train-files=gs://bucket/train.csv")


def test_a_module_runs_through_the_script_entry_point_on_every_replica(capsys):
    args = job_args("--evaluator", "--module=trainer.task", "--package_path=/app", train=PROGRAM)
    job, err = generated(args, capsys)
    assert list(job.spec.tf_replica_specs) == ["Chief", "Worker", "Evaluator"]
    for spec in job.spec.tf_replica_specs.values():
        (container,) = spec.template.spec.containers
        assert container.command == ["python", "-m", "estimator_dist.script"]
        assert container.args[:3] == [
            "--module=trainer.task",
            "--package_path=/app",
            "--model_dir=gs://bucket/census",
        ]
        assert container.args[container.args.index("--") :] == ["--", *PROGRAM]
        assert spec.restart_policy == "ExitCode"
    assert err == ""


def test_a_script_in_the_image_with_gpus_gets_nccl_before_its_arguments(capsys):
    args = job_args("--gpus_per_worker=1", "--script=/app/train.py", train=PROGRAM)
    job, _ = generated(args, capsys)
    (container,) = job.spec.tf_replica_specs["Chief"].template.spec.containers
    assert "--communication=NCCL" in container.args
    assert container.args[-4:] == ["--", "/app/train.py", *PROGRAM]
    assert not any(arg.startswith("--package_path") for arg in container.args)


@pytest.mark.parametrize(
    "extra, train, expected",
    [
        (["--module=trainer.task", "--script=t.py"], PROGRAM, ["both --script=t.py and"]),
        (["--module=trainer/task.py"], PROGRAM, ["is not a module name", "--script=FILE"]),
        (["--package_path=/app"], PROGRAM, ["--package_path=/app was given without --module"]),
        (["--module=trainer.task"], ("--steps=3",), ["needs the shared directory", "--job-dir"]),
        (["--module=trainer.task", "--num_ps=1"], PROGRAM, ["--num_ps=1 with --module"]),
        (["--communication=RING"], (REMOTE,), ["--communication is a flag of --script and"]),
    ],
)
def test_script_and_module_usage_errors_exit_2(extra, train, expected, capsys):
    code, out, err = run(job_args(*extra, train=train), capsys)
    assert code == exit_codes.USAGE, err
    assert out == ""
    for fragment in expected:
        assert fragment in err.splitlines()[0]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_module_job_imports_no_tensorflow():
    code = (
        "import sys\n"
        "from estimator_dist import manifest\n"
        "manifest.define_flags()\n"
        f"sys.argv = ['m', *{job_args('--module=trainer.task', train=PROGRAM)!r}]\n"
        "try:\n"
        "    manifest.cli.run_program(manifest.main, manifest.PROGRAM)\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'tensorflow']\n"
        "assert not loaded, loaded[:5]\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=procs.REPO, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr
    assert "estimator_dist.script" in result.stdout
