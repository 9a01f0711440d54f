"""Check that the input pipelines of a job read disjoint shards covering the data.

After a job trained with `--params=record_read_ids=DIR` (each pipeline
wrote the ids it read in its first epoch to `DIR`):

  python -m input_fns.verify --ids_dir=DIR --input_fn=tfrecord \\
      --params='files=/shared/mnist/train-*.tfrecord,features=...'

Without a job, simulating N workers in this process (each builds its
pipeline with its own `tf.distribute.InputContext`):

  python -m input_fns.verify --simulate_workers=3 --input_fn=tfrecord --params=...

The reference (every example of the data) comes from one unsharded pipeline
of the same input_fn and params, so ids are computed the same way. The
report lists examples read by more than one pipeline (a forgotten shard),
examples read by none, and pipelines that stopped before the end of their
shard. Exit codes: 0 disjoint and complete, 1 not, 2 usage error.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import tempfile
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import tensorflow as tf
from absl import flags

from estimator_dist.base.errors import UsageError
from input_fns import ids
from input_fns.pipeline import TRAIN

PROGRAM = "input_fns.verify"
#: Ids shown per problem in a report.
SHOWN = 5


@dataclasses.dataclass(frozen=True)
class ShardingReport:
    """What the pipelines of one job read, compared with each other and the data.

    Attributes:
      pipelines: Input pipelines in the job.
      read: Examples each pipeline read in its first epoch.
      absent: Pipelines that wrote no id file.
      incomplete: Pipelines that did not reach the end of their shard.
      overlapping: Ids read more often than the data holds them, with the
        pipelines that read them.
      missing: Ids of the data that no pipeline read.
      unexpected: Ids read that are not in the data.
      reference: Examples in the data, or None when no reference was given.
    """

    pipelines: int
    read: Mapping[int, int]
    absent: Tuple[int, ...]
    incomplete: Tuple[int, ...]
    overlapping: Mapping[str, Tuple[int, ...]]
    missing: Tuple[str, ...]
    unexpected: Tuple[str, ...]
    reference: Optional[int]

    @property
    def disjoint(self) -> bool:
        """No example was read by two pipelines (or twice by one)."""
        return not self.overlapping

    @property
    def complete(self) -> bool:
        """Every pipeline finished its shard and together they read every example."""
        return (
            self.reference is not None
            and not self.missing
            and not self.unexpected
            and not self.incomplete
            and not self.absent
        )

    @property
    def ok(self) -> bool:
        """Disjoint and complete."""
        return self.disjoint and self.complete

    def format(self) -> str:
        """The report as text, one finding per line."""
        data = (
            f"{self.reference} example(s) in the data"
            if self.reference is not None
            else ("no reference data (coverage not checked)")
        )
        lines = [f"Sharding check: {self.pipelines} input pipeline(s), {data}."]
        for pipeline in range(self.pipelines):
            if pipeline in self.absent:
                lines.append(f"  pipeline {pipeline}: wrote no id file")
                continue
            state = (
                "stopped before the end of its shard"
                if pipeline in self.incomplete
                else ("whole shard")
            )
            lines.append(f"  pipeline {pipeline}: read {self.read[pipeline]} example(s), {state}")
        problems = []
        if self.overlapping:
            shown = "; ".join(
                f"{key} by pipelines {', '.join(map(str, readers))}"
                for key, readers in list(self.overlapping.items())[:SHOWN]
            )
            problems.append(
                f"{len(self.overlapping)} example(s) were read by more than one pipeline or "
                f"more than once (e.g. {shown}): a pipeline does not shard its data by "
                "input_context"
            )
        if self.missing:
            problems.append(
                f"{len(self.missing)} example(s) of the data were read by no pipeline (e.g. "
                f"{', '.join(self.missing[:SHOWN])})"
            )
        if self.unexpected:
            problems.append(
                f"{len(self.unexpected)} example(s) read are not in the reference data (e.g. "
                f"{', '.join(self.unexpected[:SHOWN])}): the job read other data or params"
            )
        if self.incomplete or self.absent:
            problems.append(
                "coverage cannot be judged until every pipeline has read its whole shard: "
                "train for more steps (at least one epoch per worker)"
            )
        if self.ok:
            lines.append("Result: OK, the shards are disjoint and together cover the data.")
        elif not problems:
            lines.append("Result: disjoint; pass a reference (--input_fn) to check coverage.")
        else:
            lines.extend(f"Result: FAILED, {problem}." for problem in problems)
        return "\n".join(lines)


def check_sharding(
    recorded: Mapping[int, ids.PipelineIds], reference: Optional[Sequence[str]] = None
) -> ShardingReport:
    """Compares the ids the pipelines read with each other and with the data.

    Args:
      recorded: `ids.read_ids(DIR)`: each pipeline's ids, by pipeline id.
      reference: Every id of the data, repeats included; None checks only
        that the pipelines are disjoint.

    Returns:
      The report.
    """
    pipelines = next(iter(recorded.values())).pipelines
    totals: collections.Counter = collections.Counter()
    readers: Dict[str, list] = collections.defaultdict(list)
    for pipeline_id, pipeline in sorted(recorded.items()):
        totals.update(pipeline.ids)
        for key in pipeline.ids:
            readers[key].append(pipeline_id)
    expected = collections.Counter(reference) if reference is not None else None
    if expected is None:
        overlapping = {key: tuple(who) for key, who in readers.items() if len(who) > 1}
        missing: Tuple[str, ...] = ()
        unexpected: Tuple[str, ...] = ()
    else:
        overlapping = {
            key: tuple(who) for key, who in readers.items() if totals[key] > expected[key] > 0
        }
        missing = tuple(key for key in expected if totals[key] < expected[key])
        unexpected = tuple(key for key in totals if key not in expected)
    return ShardingReport(
        pipelines=pipelines,
        read={pipeline_id: len(pipeline.ids) for pipeline_id, pipeline in recorded.items()},
        absent=tuple(i for i in range(pipelines) if i not in recorded),
        incomplete=tuple(i for i, pipeline in sorted(recorded.items()) if not pipeline.complete),
        overlapping=overlapping,
        missing=missing,
        unexpected=unexpected,
        reference=None if expected is None else sum(expected.values()),
    )


def simulate(
    input_fn: Callable,
    params: Mapping[str, Any],
    num_pipelines: int,
    directory: str,
) -> Dict[int, ids.PipelineIds]:
    """Runs each of `num_pipelines` training pipelines in this process until its first epoch ends.

    Each pipeline gets its own `tf.distribute.InputContext`, as a worker of
    a `num_pipelines`-worker job would, and records its ids in `directory`.
    Needs eager execution.

    Args:
      input_fn: An `input_fn(mode, input_context, params)` that supports
        `record_read_ids` (every input_fn of this package does).
      params: Its params; `record_read_ids` and `batch_size` are set here.
      num_pipelines: Workers to simulate.
      directory: Where the id files go.

    Returns:
      `ids.read_ids(directory)`.

    Raises:
      UsageError: if the input_fn records no ids.
    """
    params = {**params, "record_read_ids": directory, "batch_size": 8 * num_pipelines}
    for pipeline_id in range(num_pipelines):
        context = tf.distribute.InputContext(num_pipelines, pipeline_id, num_pipelines)
        path = ids.ids_path(directory, pipeline_id, num_pipelines)
        ids.WRITERS.forget(path)
        for _ in input_fn(TRAIN, context, params):
            if ids.WRITERS.is_complete(path):
                break
            if not os.path.exists(path):
                raise UsageError(
                    f"input_fn {getattr(input_fn, '__name__', input_fn)} records no ids "
                    "with --params=record_read_ids; only input_fns of this package (or "
                    "ones built on input_fns.ids.record_ids) can be verified."
                )
    return ids.read_ids(directory)


def reference_ids(input_fn: Callable, params: Mapping[str, Any]) -> Tuple[str, ...]:
    """Every id of the training data: one unsharded pipeline's first epoch."""
    with tempfile.TemporaryDirectory(prefix="reference-ids-") as directory:
        return simulate(input_fn, params, 1, directory)[0].ids


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the command's flags on `flag_values`."""
    f = flag_values
    flags.DEFINE_string(
        "ids_dir", None, "Directory a job wrote with record_read_ids.", flag_values=f
    )
    flags.DEFINE_integer(
        "simulate_workers",
        0,
        "Instead of --ids_dir: build this many workers' pipelines here and check them.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_string(
        "input_fn",
        None,
        "The job's input_fn (registered name or package.module:function); gives the "
        "reference data. Without it only disjointness is checked.",
        flag_values=f,
    )
    flags.DEFINE_string("data_dir", None, "The job's --data_dir.", flag_values=f)
    flags.DEFINE_string("params", "", "The job's --params.", flag_values=f)
    flags.DEFINE_integer("seed", 0, "The job's --seed.", flag_values=f)


def main(argv: Sequence[str]) -> int:
    """Flags in, one check, the report out; exit 1 unless disjoint and complete."""
    from estimator_dist.base.params import parse_params_flag
    from estimator_dist.report.cli import usage_exit
    from input_fns import INPUT_FNS

    f = flags.FLAGS
    if len(argv) > 1:
        usage_exit(PROGRAM, f"unexpected positional arguments {list(argv[1:])}.")
    try:
        if bool(f.ids_dir) == bool(f.simulate_workers):
            raise UsageError("pass exactly one of --ids_dir=DIR and --simulate_workers=N.")
        if f.simulate_workers and not f.input_fn:
            raise UsageError("--simulate_workers needs --input_fn (and its --params).")
        params = {**parse_params_flag(f.params), "data_dir": f.data_dir, "seed": f.seed}
        input_fn = INPUT_FNS.get(f.input_fn) if f.input_fn else None
        with tempfile.TemporaryDirectory(prefix="simulated-ids-") as scratch:
            if f.simulate_workers:
                recorded = simulate(input_fn, params, f.simulate_workers, scratch)
            else:
                recorded = ids.read_ids(f.ids_dir)
            reference = reference_ids(input_fn, params) if input_fn else None
    except (UsageError, ValueError) as error:
        usage_exit(PROGRAM, str(error))
    report = check_sharding(recorded, reference)
    print(report.format(), flush=True)
    return 0 if report.ok or (reference is None and report.disjoint) else 1


def run() -> None:
    """Console-script entry point."""
    from estimator_dist.report.cli import run_program

    define_flags()
    run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
