"""The differential harness: one program in plain TensorFlow, and through the package.

A program (a script, or a module of a package) runs unchanged three times,
each in a model_dir of its own:

* `plain`: as its users run it, `python train.py ARGS` (or `python -m
  trainer.task ARGS`), in one process with no TF_CONFIG;
* `one process`: `python -m estimator_dist.script train.py ARGS`, no TF_CONFIG;
* `cluster`: `python -m estimator_dist.launch --num_workers=2 --evaluator
  --script=train.py -- ARGS`.

From each run it reads what the program left (`read_outcome`): the exit code,
the step of the latest checkpoint, the global steps evaluated (the evaluation
event files, written by the program's evaluations or the evaluator task), the
SavedModels exported, and the lines the program printed, numbers masked (the
chief's, on a cluster; log lines left out). `differences` then compares each
run with the plain one and names every difference distribution does not
explain: another exit code, another last step (fewer only where the input ends
by itself and the cluster shards it), a final evaluation present in one and
not the other, other exporters or another count of final exports, other
printed lines. Metric values are not compared: other workers compute other
sums in another order.

`tests/legacy/differential_test.py` runs the package's own test programs, one
per shape of the public programs it was measured on; the same functions run
real public programs outside the repository.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tests.procs import REPO, report, tail

PLAIN, ONE_PROCESS, CLUSTER = "plain", "one process", "cluster"
MODES = (PLAIN, ONE_PROCESS, CLUSTER)

#: Lines that are logs, not what a program prints: absl/TensorFlow's, Python logging's,
#: warnings, tracebacks, the package's and the launcher's own.
_LOG_LINE = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):[\w.]+:|"
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\S+\.py:\d+: \w*Warning|Traceback |  File |"
    r"estimator_dist|Final evaluation:|\[launcher\]|WARNING:absl|To enable the following)"
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class Program:
    """A program to run in every mode.

    Attributes:
      name: For messages and run directories.
      args: The program's own arguments; `{model_dir}` and `{data_dir}` are
        replaced by the run's directories.
      script: The program's file, or None with `module`.
      module: The module run as `python -m` runs it (e.g. `census.task`).
      package_path: With `module`: the directory holding its package.
      prepare: Called as `prepare(data_dir, model_dir)` before each run (data
        shared by the runs is best made once, before).
      input_ends: Training ends where the input ends (epochs), so a cluster
        whose workers shard the input may stop earlier than one process.
      launcher_args: Flags of the launcher and of `estimator_dist.script`
        (before `--`), e.g. `--model_dir={model_dir}` for a program given its
        model_dir positionally.
      train_flags: For functions named by flags: the flags of
        `estimator_dist.train` that name them, run in one process and after the
        launcher's `--`; the plain run is then the program (`script`) that
        calls TensorFlow with the same functions.
    """

    name: str
    args: Tuple[str, ...] = ()
    script: Optional[str] = None
    module: Optional[str] = None
    package_path: Optional[str] = None
    prepare: Optional[Callable[[str, str], None]] = None
    input_ends: bool = False
    launcher_args: Tuple[str, ...] = ()
    train_flags: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one run of a program left."""

    mode: str
    exit_code: int
    last_step: Optional[int]
    evaluated: Tuple[int, ...]
    exports: Dict[str, int]
    printed: Tuple[str, ...]
    output: str
    model_dir: str

    @property
    def final_evaluation(self) -> bool:
        """Whether the last checkpoint's step was evaluated."""
        return self.last_step is not None and self.last_step in self.evaluated

    def describe(self) -> str:
        return (
            f"{self.mode}: exit {self.exit_code}, last step {self.last_step}, evaluated "
            f"{list(self.evaluated)}, exports {self.exports}, {len(self.printed)} printed line(s)"
        )


def command(program: Program, mode: str, model_dir: str, data_dir: str, timeout: float) -> list:
    """The command line of `program` in `mode`."""
    fill = {"model_dir": model_dir, "data_dir": data_dir}
    args = [arg.format(**fill) for arg in program.args]
    launcher = [arg.format(**fill) for arg in program.launcher_args]
    if program.train_flags and mode != PLAIN:
        flags = [arg.format(**fill) for arg in program.train_flags]
        if mode == ONE_PROCESS:
            return [sys.executable, "-m", "estimator_dist.train", *flags]
        return [
            *_launch(timeout),
            *launcher,
            "--",
            *flags,
        ]
    script = [sys.executable, "-m", "estimator_dist.script", *launcher]
    if program.module:
        where = [f"--module={program.module}", f"--package_path={program.package_path}"]
        if mode == PLAIN:
            return [*_plain_python(), "-m", program.module, *args]
        if mode == ONE_PROCESS:
            return [*script, *where, "--", *args]
    else:
        where = [f"--script={program.script}"]
        if mode == PLAIN:
            return [*_plain_python(), program.script, *args]
        if mode == ONE_PROCESS:
            return [*script, program.script, *args]
    return [*_launch(timeout), *where, *launcher, "--", *args]


def _plain_python() -> list:
    """Python as plain TensorFlow runs a program: on TensorFlow 2.16+, with `tf.estimator` back.

    TensorFlow 2.16 and later have no `tf.estimator`; there the plain run gets
    `estimator_dist.tf_runtime.compat` (imported with `estimator_dist`, it does
    nothing else) and then runs the program as `python` would, `-m` included.
    """
    from estimator_dist.tf_runtime import compat

    if not compat.needed():
        return [sys.executable]
    run_as_python = "\n".join(
        (
            "import os, runpy, sys, estimator_dist",
            "del sys.argv[0]",  # '-c'
            "if sys.argv[0] == '-m':",
            "    del sys.argv[0]",  # runpy puts the module's file in sys.argv[0].
            "    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)",
            "else:",
            "    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))",
            "    runpy.run_path(sys.argv[0], run_name='__main__')",
        )
    )
    return [sys.executable, "-c", run_as_python]


def _launch(timeout: float) -> list:
    """The launcher's command for 2 workers and an evaluator, ended after `timeout` s."""
    return [
        sys.executable,
        "-m",
        "estimator_dist.launch",
        "--num_workers=2",
        "--evaluator",
        f"--timeout_secs={int(timeout)}",
    ]


def run(program: Program, mode: str, root: str, data_dir: str, timeout: float) -> Outcome:
    """Runs `program` once in `mode`, in `root/<mode>/`, and reads its outcome.

    The process group is killed after `timeout` seconds (the launcher's own
    --timeout_secs ends a cluster first); a run that had to be killed fails
    the test with its output.
    """
    model_dir = os.path.join(root, mode.replace(" ", "_"), "model")
    os.makedirs(model_dir)
    if program.prepare is not None:
        program.prepare(data_dir, model_dir)
    argv = command(program, mode, model_dir, data_dir, timeout)
    cwd = program.package_path if program.module and mode == PLAIN else REPO
    environ = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    environ.update({"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"})
    if program.module and mode == PLAIN:
        environ["PYTHONPATH"] = os.pathsep.join([program.package_path, REPO])
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        printed, logged = process.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        printed, logged = process.communicate()
        output = f"{printed}\n{logged}"
        raise AssertionError(
            report(f"{program.name} ({mode}) did not end in {timeout + 30:g} s; killed", output)
        ) from None
    finally:
        try:
            os.killpg(process.pid, 9)
        except ProcessLookupError:
            pass
    return read_outcome(mode, process.returncode, printed, logged, model_dir)


def read_outcome(mode: str, exit_code: int, printed: str, logged: str, model_dir: str) -> Outcome:
    """What a finished run left in `model_dir` and printed.

    Args:
      mode: How the program ran.
      exit_code: Its exit code.
      printed: Its standard output; on a cluster, the launcher's.
      logged: Its standard error.
      model_dir: The run's model_dir.
    """
    if mode == CLUSTER:  # The chief's log holds both of its streams.
        printed = _chief_output(printed, model_dir)
    return Outcome(
        mode,
        exit_code,
        checkpoint_step(model_dir),
        evaluated_steps(model_dir),
        exports(os.path.dirname(model_dir)),
        printed_lines(printed, os.path.dirname(model_dir)),
        f"{printed}\n{logged}",
        model_dir,
    )


def _chief_output(output: str, model_dir: str) -> str:
    """The chief's whole output: its task log, else its lines on the launcher's console."""
    for path in sorted(glob.glob(os.path.join(model_dir, "logs", "chief*.log"))):
        with open(path, errors="replace") as stream:
            return stream.read()
    return "\n".join(line[8:] for line in output.splitlines() if line.startswith("[chief] "))


def checkpoint_step(model_dir: str) -> Optional[int]:
    """The step of the checkpoint the `checkpoint` file names, or None."""
    path = os.path.join(model_dir, "checkpoint")
    if not os.path.exists(path):
        return None
    with open(path) as stream:
        match = re.search(r'^model_checkpoint_path: ".*-(\d+)"', stream.read(), re.M)
    return int(match.group(1)) if match else None


def evaluated_steps(model_dir: str) -> Tuple[int, ...]:
    """The global steps of the evaluations whose summaries the event files of `eval*/` hold."""
    import tensorflow as tf

    steps = set()
    for path in glob.glob(os.path.join(model_dir, "eval*", "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            if event.HasField("summary") and event.summary.value:
                steps.add(int(event.step))
    return tuple(sorted(steps))


def exports(root: str) -> Dict[str, int]:
    """SavedModels under `root`, counted by the directory holding their timestamped folders."""
    counts: Dict[str, int] = collections.Counter()
    for path in glob.glob(os.path.join(root, "**", "saved_model.pb"), recursive=True):
        holder = os.path.dirname(os.path.dirname(path))
        if "/tmp-" in path or os.path.basename(os.path.dirname(path)).startswith("temp-"):
            continue
        counts[os.path.relpath(holder, root).split(os.sep, 1)[-1]] += 1
    return dict(counts)


def printed_lines(output: str, root: str = "") -> Tuple[str, ...]:
    """The lines a program printed itself, numbers masked; log lines left out.

    A deprecation notice's lines ("Instructions for updating:" and the line
    after it) are logs too; `root`, the run's directory, reads `<run>`.

    >>> printed_lines("I1127 14:00:00.1 x.py:1] noise\\naccuracy 0.93 at step 200\\n")
    ('accuracy # at step #',)
    """
    kept = []
    notice = False
    for line in output.splitlines():
        if notice or line.startswith("Instructions for updating:"):
            notice = not notice
            continue
        if not line.strip() or _LOG_LINE.match(line) or line.startswith((" ", "\t")):
            continue
        if root:
            line = line.replace(root, "<run>")
        kept.append(_NUMBER.sub("#", line.strip()))
    return tuple(kept)


def differences(plain: Outcome, other: Outcome, input_ends: bool) -> List[str]:
    """What `other` did that the plain run did not, beyond what distribution explains."""
    found = []
    if other.exit_code != plain.exit_code:
        found.append(f"exit code {other.exit_code}, plain {plain.exit_code}")
    fewer_allowed = input_ends and other.mode == CLUSTER
    if other.last_step != plain.last_step and not (
        fewer_allowed
        and None not in (other.last_step, plain.last_step)
        and other.last_step < plain.last_step
    ):
        found.append(f"last checkpoint step {other.last_step}, plain {plain.last_step}")
    if other.final_evaluation != plain.final_evaluation:
        found.append(
            f"final evaluation {'present' if other.final_evaluation else 'missing'} "
            f"(evaluated {list(other.evaluated)} of last step {other.last_step}), plain "
            f"{'has' if plain.final_evaluation else 'has none'} ({list(plain.evaluated)})"
        )
    if set(other.exports) != set(plain.exports):
        found.append(f"exports {other.exports}, plain {plain.exports}")
    for name in set(other.exports) & set(plain.exports):
        if "final" in name.lower() and other.exports[name] != plain.exports[name]:
            found.append(f"{other.exports[name]} export(s) in {name}, plain {plain.exports[name]}")
    seen = collections.Counter(other.printed)
    if other.mode == CLUSTER:  # The chief's log holds its logs too: count the program's lines.
        seen = collections.Counter({line: seen[line] for line in set(plain.printed) if seen[line]})
    extra = seen - collections.Counter(plain.printed)
    missing = collections.Counter(plain.printed) - seen
    if extra or missing:
        shown = [f"+{line!r}" for line in extra] + [f"-{line!r}" for line in missing]
        found.append(f"printed lines differ from plain (+ more, - fewer): {'; '.join(shown)}")
    return found


def compare(outcomes: Dict[str, Outcome], program: Program) -> Dict[str, List[str]]:
    """Each run's differences from the plain one, by mode; empty lists when all agree."""
    plain = outcomes[PLAIN]
    return {
        mode: differences(plain, outcome, program.input_ends)
        for mode, outcome in outcomes.items()
        if mode != PLAIN
    }


def explain(program: Program, outcomes: Dict[str, Outcome], found: Dict[str, List[str]]) -> str:
    """A failure message: each difference, each run's outcome, then the end of each output."""
    lines = [f"{program.name}: the package's runs differ from plain TensorFlow's"]
    for mode, items in found.items():
        lines += [f"  {mode}: {item}" for item in items]
    lines += [f"  {outcome.describe()}" for outcome in outcomes.values()]
    for mode, outcome in outcomes.items():
        lines.append(f"----- {mode}: last lines -----\n{tail(outcome.output)}")
    return "\n".join(lines)


def run_all(
    program: Program, root: str, data_dir: str, timeout: float, modes: Sequence[str] = MODES
) -> Dict[str, Outcome]:
    """Runs `program` in every mode, at once (the runs wait on start-ups and each other)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(len(modes)) as pool:
        futures = {mode: pool.submit(run, program, mode, root, data_dir, timeout) for mode in modes}
        return {mode: future.result() for mode, future in futures.items()}
