"""The console a person reads: progress lines, what it keeps of the log, where the rest goes."""

import doctest
import logging
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

from estimator_dist.config.train_args import job_from_args
from estimator_dist.guards import roles as guards
from estimator_dist.guards.roles import ProgressHook, progress_hook
from estimator_dist.report import console, status
from estimator_dist.report.console import ConsoleFilter, LogFormatter, format_progress
from model_fns import optimizers
from run_config.run_config import make_run_config
from tests.procs import REPO

# --- what a person sees of a task's output ---------------------------------------------

#: Lines of a real task log (TF 2.15), and what the console shows of each.
TASK_OUTPUT = [
    (
        "2026-11-24 02:17:55.123395: E external/local_xla/xla/stream_executor/cuda/"
        "cuda_dnn.cc:9261] Unable to register cuDNN factory: Attempting to register factory",
        None,
    ),
    (
        "2026-11-24 02:35:41.160418: I tensorflow/core/platform/cpu_feature_guard.cc:182] This "
        "TensorFlow binary is optimized to use available CPU instructions in performance-critical "
        "operations.",
        None,
    ),
    (
        "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
        "TensorFlow with the appropriate compiler flags.",
        None,
    ),
    (
        "W1124 02:17:59.867113 140479717346176 deprecation.py:50] From /x/estimator_dist/"
        "preflight.py:318: RunConfig.__init__ (from tensorflow_estimator) is deprecated",
        None,
    ),
    ("W1124 02:17:59.867113 140479717346176 deprecation.py:50] Instructions for updating:", None),
    ("W1124 02:17:59.867113 140479717346176 deprecation.py:50] Use tf.keras instead.", None),
    (
        "I1124 02:17:59.870355 140479717346176 estimator.py:200] Using config: {'_model_dir': "
        "'/tmp/run0', '_tf_random_seed': None, '_session_config': allow_soft_placement: true",
        None,
    ),
    ("I1124 02:17:59.870355 140479717346176 estimator.py:200] graph_options {", None),
    (
        "I1124 02:18:01.251035 140584102452096 estimator_dist/task/driver.py:631] Task worker-0: "
        "strategy multi_worker_mirrored, communication requested RING, used RING",
        None,
    ),
    (
        "/venv/lib/python3.11/site-packages/tensorflow/python/data/ops/dataset_ops.py:462: "
        "UserWarning: To make it possible to preserve tf.data options across serialization",
        None,
    ),
    ('  warnings.warn("To make it possible to preserve tf.data options across "', None),
    (
        "I1124 02:18:03.626438 140479717346176 startup.py:107] estimator_dist: "
        "task chief-0 start-up 9.3 s: imports 5.0 s, first step 0.8 s",
        "estimator_dist: task chief-0 start-up 9.3 s: imports 5.0 s, first step 0.8 s",
    ),
    (
        "I1124 02:18:03.626610 140479717346176 basic_session_run_hooks.py:265] loss = 2.3114226, "
        "step = 0",
        None,
    ),
    (
        "I1124 02:18:06.462966 140479717346176 basic_session_run_hooks.py:716] global_step/sec: "
        "106.253",
        None,
    ),
    (
        "I1124 02:18:06.459632 140479717346176 roles.py:228] [ 50%] loss = 0.2320, "
        "step = 200/400, 6,830 examples/s, ~2 s left",
        "[ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left",
    ),
    (
        "W1124 02:18:06.500000 140479717346176 input_fns/pipeline.py:313] input_fn tfrecord: no "
        "eval_files given; evaluating on files=/data/*.tfrecord.",
        "WARNING: input_fn tfrecord: no eval_files given; evaluating on files=/data/*.tfrecord.",
    ),
    (
        "W1124 02:18:06.600000 140479717346176 strategies.py:207] a TensorFlow warning",
        None,
    ),
    (
        "I1124 02:18:11.923113 139738113780608 estimator.py:2085] Saving dict for global step "
        "400: accuracy = 0.962963, global_step = 400, loss = 0.1290535",
        "Saving dict for global step 400: accuracy = 0.962963, global_step = 400, loss = 0.1290535",
    ),
    (
        "E1124 02:18:12.000000 139738113780608 estimator_dist/task/diagnose.py:293] Collective "
        "failure, full TensorFlow error: Socket closed",
        None,
    ),
    (
        "E1124 02:18:12.100000 139738113780608 watchdog.py:84] estimator_dist: "
        "task chief-0 failed (exit 150): AbortedError at global step 57",
        None,
    ),
    (
        "estimator_dist: task chief-0 failed (exit 150): AbortedError at global step 57",
        "estimator_dist: task chief-0 failed (exit 150): AbortedError at global step 57",
    ),
    # TensorFlow 2.21's C++ start-up lines, logged before its clock is set up.
    (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        None,
    ),
    (
        "I0000 00:00:1795804501.697727   12295 cpu_feature_guard.cc:227] This TensorFlow binary "
        "is optimized to use available CPU instructions in performance-critical operations.",
        None,
    ),
    (
        "E0000 00:00:1795804501.697727   12295 cuda_platform.cc:52] failed call to cuInit: "
        "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
        None,
    ),
    ("Traceback (most recent call last):", "Traceback (most recent call last):"),
    ('  File "/x/train.py", line 3, in <module>', '  File "/x/train.py", line 3, in <module>'),
    (
        "Final evaluation: global_step=400, accuracy=0.9630, loss=0.1291",
        "Final evaluation: global_step=400, accuracy=0.9630, loss=0.1291",
    ),
]


def test_docstring_examples_hold():
    assert doctest.testmod(console).failed == 0


def test_the_console_keeps_progress_people_lines_own_warnings_and_prints_only():
    keep = ConsoleFilter()
    for line, shown in TASK_OUTPUT:
        assert keep(line + "\n") == shown, line


def test_the_later_lines_of_a_record_follow_its_first():
    keep = ConsoleFilter()
    prefix = "W1124 02:18:06.500000 1404 estimator_dist/task/preflight.py:341]"
    assert keep(f"{prefix} pre-flight: 1 multi-worker pitfall found:") == (
        "WARNING: pre-flight: 1 multi-worker pitfall found:"
    )
    assert keep(f"{prefix}   [input-context] train input_fn takes no input_context") == (
        "  [input-context] train input_fn takes no input_context"
    )
    # The same file and line a microsecond later is another record.
    assert keep(f"{prefix.replace('500000', '500001')} next") == "WARNING: next"


@pytest.mark.parametrize(
    "args, line",
    [
        (
            (1, 400, 2.31, 100.0, 399.0),
            "[  0%] loss = 2.3100, step = 1/400, 100 examples/s, ~7 min left",
        ),
        (
            (399, 400, 0.5, 12345.6, 0.2),
            "[ 99%] loss = 0.5000, step = 399/400, 12,346 examples/s, <1 s left",
        ),
        ((400, 400, float("nan"), None, None), "[100%] loss = nan, step = 400/400, done"),
        ((30, 100000, None, None, None), "[  0%] step = 30/100000"),
        (
            (200, 400, 0.23203, 6830.4, 2.4, 0.00012345),
            "[ 50%] loss = 0.2320, learning_rate = 0.0001234, step = 200/400, 6,830 examples/s, "
            "~2 s left",
        ),
    ],
)
def test_progress_lines(args, line):
    assert format_progress(*args) == line
    assert console.PROGRESS.match(line)


def test_own_code_is_the_packages_and_the_users_not_the_librarys():
    assert console.is_own_code(guards.__file__)
    assert console.is_own_code("/home/me/my_project/models.py")
    assert not console.is_own_code(tf.__file__)
    assert not console.is_own_code(logging.__file__)
    assert not console.is_own_code("<string>")


def test_log_records_carry_their_prefix_on_every_line_and_own_files_by_path():
    formatter = LogFormatter()
    own = logging.LogRecord("absl", logging.WARNING, guards.__file__, 12, "one\ntwo", None, None)
    library = logging.LogRecord("tensorflow", logging.INFO, tf.__file__, 3, "three", None, None)
    first, second = formatter.format(own).split("\n")
    assert re.match(r"W\d{4} [\d:.]+ +\d+ guards/roles\.py:12\] one$", first)
    assert second == first[: -len("one")] + "two"
    assert re.match(r"I\d{4} [\d:.]+ +\d+ __init__\.py:3\] three$", formatter.format(library))


# --- the progress hook in a real Estimator ----------------------------------------------

BATCH = 8


def model_fn(features, labels, mode):
    """loss = (w - 3)^2 with w = 0 at first: at the n-th step, before its update, 9 * 0.64^(n-1)."""
    weight = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.square(weight - 3.0) + 0.0 * tf.reduce_mean(features["x"])
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
    features = {"x": np.arange(64, dtype=np.float32).reshape(64, 1)}
    return (
        tf.data.Dataset.from_tensor_slices((features, np.zeros(64, np.float32)))
        .repeat()
        .batch(BATCH)
    )


class Recorded(ProgressHook):
    """A ProgressHook that notes which runs fetch something, on a clock ticking 1 s a read."""

    def __init__(self, *args):
        ticks = iter(range(1000))
        super().__init__(*args, clock=lambda: float(next(ticks)))
        self.fetches = []

    def before_run(self, run_context):
        request = super().before_run(run_context)
        self.fetches.append(request is not None)
        return request


@pytest.fixture
def lines(monkeypatch):
    """The progress lines logged (`[ 20%] loss = ...`), not other INFO lines such as a patch's."""
    logged = []

    def info(fmt, *args):
        if (fmt % args).startswith("["):
            logged.append(fmt % args)

    monkeypatch.setattr(guards.logging, "info", info)
    return logged


def test_one_line_exactly_at_every_nth_step_and_no_fetch_in_between(tmp_path, lines):
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path), tf.estimator.RunConfig())
    hook = Recorded(50, BATCH, 10)
    estimator.train(input_fn, max_steps=50, hooks=[hook])
    # The first line's rate runs from the end of step 1 (clock 0) to step 10 (clock 1).
    assert lines == [
        f"[ 20%] loss = {9 * 0.64**9:.4f}, step = 10/50, 72 examples/s, ~4 s left",
        f"[ 40%] loss = {9 * 0.64**19:.4f}, step = 20/50, 80 examples/s, ~3 s left",
        f"[ 60%] loss = {9 * 0.64**29:.4f}, step = 30/50, 80 examples/s, ~2 s left",
        f"[ 80%] loss = {9 * 0.64**39:.4f}, step = 40/50, 80 examples/s, ~1 s left",
        f"[100%] loss = {9 * 0.64**49:.4f}, step = 50/50, 80 examples/s, done",
    ]
    assert [run for run, fetched in enumerate(hook.fetches, 1) if fetched] == [10, 20, 30, 40, 50]
    assert len(hook.fetches) == 50


def test_each_progress_line_tells_the_launcher_its_figures(tmp_path, lines, monkeypatch):
    sent = []
    monkeypatch.setattr(status, "emit", sent.append)
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path), tf.estimator.RunConfig())
    estimator.train(input_fn, max_steps=20, hooks=[Recorded(20, BATCH, 10)])
    assert sent == [
        status.Progress(10, 20, pytest.approx(9 * 0.64**9, rel=1e-3), 72.0, 10, 1.0),
        status.Progress(20, 20, pytest.approx(9 * 0.64**19, rel=1e-3), 80.0, 10, 1.0),
    ]


def test_a_healed_gap_leaves_the_rate_and_the_time_left_as_they_were(tmp_path, lines):
    # Steps 20 to 30 take 31 s instead of 1 s: a network cut that healed, or a pause.
    times = iter([0.0, 1.0, 2.0, 33.0, 34.0, 35.0])
    hook = ProgressHook(50, BATCH, 10, clock=lambda: next(times))
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path), tf.estimator.RunConfig())
    estimator.train(input_fn, max_steps=50, hooks=[hook])
    assert [line.split("step = ")[1] for line in lines] == [
        "10/50, 72 examples/s, ~4 s left",
        "20/50, 80 examples/s, ~3 s left",
        "30/50, 80 examples/s, ~2 s left",  # From the interval before; 3 examples/s without.
        "40/50, 80 examples/s, ~1 s left",
        "50/50, 80 examples/s, done",
    ]


def test_a_slower_pace_that_lasts_is_the_new_rate():
    rate = console.StepRate()
    assert [rate.add(10, 1.0) for _ in range(3)] == [10.0, 10.0, 10.0]
    assert rate.add(10, 10.0) == 10.0  # One slow interval: a gap.
    assert rate.add(10, 10.0) == 1.0  # Two in a row: the machine is slower now.
    assert rate.add(10, 8.0) == 1.25
    assert rate.add(0, 1.0) == 1.25  # No step: the last rate stays.


def test_a_resumed_job_prints_at_the_global_step_boundaries(tmp_path, lines):
    estimator = tf.estimator.Estimator(model_fn, str(tmp_path), tf.estimator.RunConfig())
    estimator.train(input_fn, max_steps=25)
    hook = Recorded(75, BATCH, 20)
    estimator.train(input_fn, max_steps=75, hooks=[hook])
    assert [re.search(r"step = (\d+)/75", line)[1] for line in lines] == ["40", "60", "75"]
    assert [run for run, fetched in enumerate(hook.fetches, 1) if fetched] == [15, 35, 50]


def test_the_examples_of_a_step_follow_the_job():
    assert progress_hook(400, 64, 100)._examples_per_step == 64
    assert progress_hook(400, 64, 100, gradient_accumulation_steps=4)._examples_per_step == 256
    assert progress_hook(400, 64, 100, workers_step_alone=2)._examples_per_step == 32
    assert ProgressHook(400, None, 100)._examples_per_step is None  # A script's unknown batch.
    with pytest.raises(ValueError, match="every_n_steps=0"):
        ProgressHook(400, 64, 0)


def scheduled_model_fn(features, labels, mode, params):
    """mnist_cnn's loss without the network: the rate comes from `optimizers.learning_rate`."""
    weight = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.square(weight - 3.0) + 0.0 * tf.reduce_mean(features["x"])
    rate = optimizers.learning_rate(params, 0.1)
    optimizer = optimizers.with_gradient_accumulation(
        tf.compat.v1.train.GradientDescentOptimizer(rate), params
    )
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.slow
def test_epochs_checkpoint_at_each_boundary_and_show_the_rate_they_decay(tmp_path, lines):
    job = job_from_args(
        [
            f"--model_dir={tmp_path}",
            f"--batch_size={BATCH}",
            "--num_train_examples=40",  # 5 steps an epoch.
            "--train_epochs=4",
            "--save_checkpoints_epochs=1",
            "--params=decay_epochs=2",
            "--save_summary_steps=1",
            "--log_step_count_steps=5",
        ]
    )
    assert (job.train_steps, job.run.save_checkpoints_steps) == (20, 5)
    estimator = tf.estimator.Estimator(
        scheduled_model_fn, config=make_run_config(job.run), params=job.model_params
    )
    hook = progress_hook(job.train_steps, job.batch_size, job.run.log_step_count_steps)
    estimator.train(input_fn, max_steps=job.train_steps, hooks=[hook])

    progress = [line for line in lines if console.PROGRESS.match(line)]
    rates = [
        re.search(r"learning_rate = ([\d.]+), step = (\d+)/20", line).groups() for line in progress
    ]
    # The rate decays after step 10, the end of epoch 2.
    assert rates == [("0.1", "5"), ("0.1", "10"), ("0.01", "15"), ("0.01", "20")]
    state = tf.train.get_checkpoint_state(str(tmp_path))
    steps = [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths]
    assert {5, 10, 15, 20} <= set(steps) <= {0, 5, 10, 15, 20}
    scalars = {}
    for path in tf.io.gfile.glob(str(tmp_path / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "learning_rate":
                    scalars[event.step] = round(value.simple_value, 6)
    assert set(scalars.values()) == {0.1, 0.01}
    assert max(s for s, v in scalars.items() if v == 0.1) < min(
        s for s, v in scalars.items() if v == 0.01
    )


def test_a_tensor_named_learning_rate_is_found_as_in_model_garden():
    with tf.Graph().as_default() as graph:
        assert guards.find_learning_rate(graph) is None
        rate = tf.identity(tf.constant(0.1), name="learning_rate")
        assert guards.find_learning_rate(graph) is rate
    with tf.Graph().as_default() as graph:
        tf.identity(tf.constant([0.1, 0.2]), name="learning_rate")  # Not a scalar: not a rate.
        assert guards.find_learning_rate(graph) is None


# --- a single process: the full log to model_dir/logs, the console quiet ----------------

SCRIPT = """
import os, sys, warnings
from absl import app, logging
from estimator_dist.report import console

def main(argv):
    console.start_task(verbose=os.environ["VERBOSE"] == "1")
    import tensorflow as tf
    tf.compat.v1.estimator.RunConfig(model_dir=None)  # A deprecation warning.
    warnings.warn("a library warning", UserWarning)
    os.write(2, b"2026-01-01 00:00:00.000000: I native.cc:1] a line of the C++ runtime\\n")
    logging.info("an INFO line")
    logging.info("estimator_dist: a line for people")
    logging.warning("a warning of the user's code")
    console.keep_log(os.environ["MODEL_DIR"], "local")
    logging.info("an INFO line after the log moved")
    print("Final evaluation: done", flush=True)

app.run(main)
"""


def run_script(tmp_path, verbose, model_dir, **extra_env):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TF_CONFIG", "CLUSTER_SPEC", console.SUPERVISED_ENV)
    }
    env.update(
        extra_env,
        VERBOSE=str(int(verbose)),
        MODEL_DIR=str(model_dir),
        PYTHONPATH=REPO,
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="0",
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout
    return done.stdout.splitlines()


@pytest.mark.multiprocess
def test_a_vertex_task_given_only_cluster_spec_keeps_everything_on_its_output(tmp_path):
    spec = '{"cluster": {"workerpool0": ["h0:2222"]}, "task": {"type": "workerpool0", "index": 0}}'
    output = run_script(tmp_path, verbose=False, model_dir=tmp_path, CLUSTER_SPEC=spec)
    assert any(line.endswith("] an INFO line") for line in output), output
    assert not (tmp_path / "logs").exists()


@pytest.mark.multiprocess
def test_a_single_process_logs_everything_to_model_dir_and_shows_what_people_need(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    output = run_script(tmp_path, verbose=False, model_dir=model_dir)
    assert output == [
        "estimator_dist: a line for people",
        "WARNING: a warning of the user's code",
        "Final evaluation: done",
    ]
    log = (model_dir / "logs" / "local.log").read_text()
    assert re.search(r"deprecation\.py:\d+\] From .*RunConfig.* is deprecated", log)
    assert re.search(r"deprecation\.py:\d+\] Instructions for updating:", log)
    assert "UserWarning: a library warning" in log
    assert "I native.cc:1] a line of the C++ runtime" in log
    assert re.search(r"user_script\.py:\d+\] an INFO line\n", log)
    assert re.search(r"user_script\.py:\d+\] an INFO line after the log moved", log)
    assert "Final evaluation" not in log


@pytest.mark.multiprocess
def test_verbose_keeps_everything_on_the_console(tmp_path):
    model_dir = tmp_path / "model"
    output = "\n".join(run_script(tmp_path, verbose=True, model_dir=model_dir))
    assert re.search(r"deprecation\.py:\d+\] From .*RunConfig.* is deprecated", output)
    assert "UserWarning: a library warning" in output
    assert "I native.cc:1] a line of the C++ runtime" in output
    assert re.search(r"user_script\.py:\d+\] an INFO line", output)
    assert output.endswith("Final evaluation: done")
    assert not model_dir.exists()


@pytest.mark.multiprocess
def test_an_unwritable_model_dir_gets_a_local_log_named_on_the_console(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.write_text("a file where the directory should be")
    output = run_script(tmp_path, verbose=False, model_dir=model_dir)
    notice = re.match(
        rf"cannot write {model_dir}/logs/local\.log \(.+\); the full log goes to (\S+)$", output[2]
    )
    assert notice, output
    assert output[:2] + output[3:] == [
        "estimator_dist: a line for people",
        "WARNING: a warning of the user's code",
        "Final evaluation: done",
    ]
    with open(notice[1]) as log:
        assert "is deprecated" in log.read()
    os.remove(notice[1])


def test_absl_logs_as_before_in_a_process_that_never_set_up_its_console():
    assert console._quiet is None
    assert not isinstance(absl_logging.get_absl_handler().python_handler.stream, console._LogSink)


def test_raw_grpc_details_of_a_native_error_stay_in_the_task_log():
    # What a chief printed when its peer's socket closed (TensorFlow 2.15); then its own line.
    lines = [
        "2026-11-26 15:30:52.227637: E tensorflow/core/common_runtime/ring_alg.cc:291] Aborting "
        "RingReduce with UNAVAILABLE: Socket closed",
        "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while "
        "calling /tensorflow.WorkerService/RecvBuf:",
        ':{"created":"@1795707052.227469618","description":"Error received from peer '
        'ipv4:127.0.0.1:43949","grpc_message":"Socket closed","grpc_status":14}',
        "The error could be from a previous operation. Restart your program to reset. "
        "[type.googleapis.com/tensorflow.DerivedStatus='']",
        "Final evaluation: global_step=400, accuracy=0.9630",
    ]
    keep = console.ConsoleFilter()
    assert [shown for shown in map(keep, lines) if shown is not None] == [
        "Final evaluation: global_step=400, accuracy=0.9630"
    ]


@pytest.mark.multiprocess
def test_a_supervised_task_sends_its_heartbeat_before_tensorflow_is_imported():
    from estimator_dist.report import status

    read_fd, write_fd = os.pipe()
    code = (
        "import sys\n"
        "from estimator_dist.report import console\n"
        "console.start_task(verbose=False)\n"
        "assert 'tensorflow' not in sys.modules\n"
        "sys.stdin.read()\n"  # Alive until the test has read its heartbeat.
    )
    env = {**os.environ, console.SUPERVISED_ENV: "1", status.STATUS_FD_ENV: str(write_fd)}
    task = subprocess.Popen(
        [sys.executable, "-c", code], env=env, pass_fds=(write_fd,), stdin=subprocess.PIPE
    )
    os.close(write_fd)
    try:
        with open(read_fd) as channel:
            assert status.decode(channel.readline()) == status.Heartbeat()
    finally:
        task.communicate(b"", timeout=30)
    assert task.returncode == 0
