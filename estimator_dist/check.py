"""Check a job or a legacy Estimator script for multi-worker pitfalls, without training.

  python -m estimator_dist.check --script=my_old_train.py
  python -m estimator_dist.check --num_workers=2 -- --model_fn=my.model:model_fn \\
      --input_fn=my.data:input_fn --model_dir=/tmp/check

  python -m estimator_dist.check --module=trainer.task --package_path=src

With `--script` (or `--module`: every file of the module's package), it reads
the source without running it, and says whether
`python -m estimator_dist.launch --script=...` (`--module=...`) can run it:

  train.py: will run with --script: yes (calls tf.estimator.train_and_evaluate at line 48)
  run.py: will run with --script: cannot tell statically: train_and_evaluate(...) at line 9
  comes from module helpers, which it did not read; ...

A call counts only when it is TensorFlow's, resolved through the imports
(`estimator_dist.programs.scan`, whose `RULES` table decides). It reports
where TensorFlow's `train_and_evaluate` and `Estimator.train`/`evaluate` calls
are, `TrainSpec`s without `max_steps`, `save_checkpoints_secs=` and input_fns
without `input_context`. With training flags after `--`, it runs the same
pre-flight as every task does before training: it resolves the names,
reads the input_fn's first batch shapes, builds the model once and
reports the pitfalls of a `--num_workers` job (input_fn without
`input_context`, evaluation reading the training input, a Keras model that
is not compiled, subclassed, or compiled with a non-legacy optimizer).
Each finding comes with its fix.
Exit code 0: nothing fatal; 2: at least one pitfall stops a multi-worker job,
or a bad flag, script or module.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from absl import flags

from estimator_dist.base.errors import UsageError
from estimator_dist.config.train_args import job_from_args
from estimator_dist.programs import scan as program_scan
from estimator_dist.programs.locate import check_package_path, find_module, program_report
from estimator_dist.report import cli
from estimator_dist.task import pitfalls

PROGRAM = "estimator_dist.check"

_SCRIPT = flags.DEFINE_multi_string("script", [], "Python file to scan; may be repeated.")
_MODULE = flags.DEFINE_string(
    "module",
    None,
    "A module run as `python -m` runs it (e.g. trainer.task): scan every file of its "
    "top-level package, and the modules of --package_path it imports.",
)
_PACKAGE_PATH = flags.DEFINE_string(
    "package_path",
    None,
    "With --module: the directory holding its top-level package (default: the current directory).",
)
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", 2, "Workers of the job being checked.", lower_bound=1
)


def check_scripts(paths: Sequence[str]) -> Tuple[List[str], List[pitfalls.Pitfall]]:
    """Scans each script's source (and the modules beside it that it imports).

    Returns:
      One verdict line per script (`<path>: will run with --script: ...`),
      followed by its informational findings, and the pitfalls found.

    Raises:
      UsageError: if a file cannot be read or is not Python.
    """
    verdicts, found = [], []
    for path in paths:
        verdict, scan, scanned = program_report(path, None, None)
        verdicts += _lines(path, verdict, scan, scanned, per_file=len(scan.files) > 1)
        found += scanned
    return verdicts, found


def check_module(
    module: str, package_path: Optional[str]
) -> Tuple[List[str], List[pitfalls.Pitfall]]:
    """Scans every file of a module's top-level package, and the modules of the package
    path it imports; the verdict line first, then one line per file read.

    Raises:
      UsageError: for a module that cannot be found, or a file that is not Python.
    """
    root = check_package_path(package_path)
    find_module(module, root)
    verdict, scan, found = program_report(None, module, root)
    return _lines(f"{module} (in {root})", verdict, scan, found, per_file=True), found


def _lines(
    name: str,
    verdict: program_scan.Verdict,
    scan: program_scan.Scan,
    found: Sequence[pitfalls.Pitfall],
    per_file: bool,
) -> List[str]:
    later = "; fix the pre-flight errors below" if any(p.fatal for p in found) else ""
    lines = [f"{name}: {verdict}{later if verdict.runs else ''}"]
    return [*lines, *(scan.per_file() if per_file else [])]


def check_job(train_args: Sequence[str], num_workers: int) -> List[pitfalls.Pitfall]:
    """Runs the pre-flight of a job given by training flags; returns its warnings.

    Raises:
      UsageError: for bad flags or a fatal pitfall (the message lists them).
    """
    from estimator_dist.task import preflight

    args = list(train_args)
    if not any(arg.startswith("--model_dir") for arg in args):
        args.append("--model_dir=/nonexistent/estimator_dist_check")
    return list(preflight.preflight(job_from_args(args), num_workers).pitfalls)


def main(argv: Sequence[str]) -> int:
    """Prints one line per pitfall; exits 2 when one is fatal."""

    train_args = list(argv[1:])
    if not train_args and not _SCRIPT.value and not _MODULE.value:
        cli.usage_exit(
            PROGRAM,
            "nothing to check: give --script=FILE, --module=PACKAGE.MODULE and/or training "
            "flags after '--'.",
        )
    try:
        if _PACKAGE_PATH.value is not None and not _MODULE.value:
            raise UsageError(
                f"--package_path={_PACKAGE_PATH.value} was given without --module; expected "
                "it only with --module=PACKAGE.MODULE. Add --module, or leave it out."
            )
        verdicts, found = check_scripts(_SCRIPT.value)
        if _MODULE.value:
            lines, more = check_module(_MODULE.value, _PACKAGE_PATH.value)
            verdicts, found = [*verdicts, *lines], [*found, *more]
        if train_args:
            found += check_job(train_args, _NUM_WORKERS.value)
    except UsageError as error:
        cli.usage_exit(PROGRAM, str(error))
    print("\n".join([*verdicts, pitfalls.format_report(found)]), flush=True)
    return 2 if any(pitfall.fatal for pitfall in found) else 0


def run() -> None:
    """Console-script entry point."""
    cli.run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
