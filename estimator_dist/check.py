"""Check a job or a legacy Estimator script for multi-worker pitfalls, without training.

  python -m estimator_dist.check --script=my_old_train.py
  python -m estimator_dist.check --num_workers=2 -- --model_fn=my.model:model_fn \\
      --input_fn=my.data:input_fn --model_dir=/tmp/check

With `--script`, it reads the script's source (without running it), says
whether `python -m estimator_dist.launch --script=...` can run it as it is:

  train.py: will run with --script: yes (calls tf.estimator.train_and_evaluate at line 48)
  before.py: will run with --script: no: calls estimator.train(...) at line 55; replace it ...

and reports `estimator.train(...)`/`evaluate(...)` calls, `TrainSpec`s
without `max_steps`, `save_checkpoints_secs=` and input_fns without
`input_context`. With training flags after `--`, it runs the same
pre-flight as every task does before training: it resolves the names,
reads the input_fn's first batch shapes, builds the model once and
reports the pitfalls of a `--num_workers` job (input_fn without
`input_context`, evaluation reading the training input, a Keras model that
is not compiled, subclassed, or compiled with a non-legacy optimizer).
Each finding comes with its fix.
Exit code 0: nothing fatal; 2: at least one pitfall stops a multi-worker job
(a script that calls estimator.train or has a TrainSpec without max_steps
will not run with --script either).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from absl import flags

from estimator_dist.base import cli, pitfalls
from estimator_dist.train_args import job_from_args

PROGRAM = "estimator_dist.check"

_SCRIPT = flags.DEFINE_multi_string("script", [], "Python file to scan; may be repeated.")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", 2, "Workers of the job being checked.", lower_bound=1
)


def check_scripts(paths: Sequence[str]) -> Tuple[List[str], List[pitfalls.Pitfall]]:
    """Scans each file's source.

    Returns:
      One verdict line per script (`<path>: will run with --script: ...`) and
      the pitfalls found.

    Raises:
      UsageError: if a file cannot be read or is not Python.
    """
    from estimator_dist.base.errors import UsageError

    verdicts, found = [], []
    for path in paths:
        try:
            with open(path) as stream:
                source = stream.read()
            verdict = pitfalls.script_verdict(source, path)
            scanned = pitfalls.scan_source(source, path)
        except OSError as error:
            raise UsageError(f"--script={path} cannot be read: {error.strerror}.") from None
        except SyntaxError as error:
            raise UsageError(
                f"--script={path} is not valid Python (line {error.lineno}: {error.msg})."
            ) from None
        later = "; fix the pre-flight errors below" if any(p.fatal for p in scanned) else ""
        verdicts.append(f"{path}: {verdict}{later if verdict.runs else ''}")
        found += scanned
    return verdicts, found


def check_job(train_args: Sequence[str], num_workers: int) -> List[pitfalls.Pitfall]:
    """Runs the pre-flight of a job given by training flags; returns its warnings.

    Raises:
      UsageError: for bad flags or a fatal pitfall (the message lists them).
    """
    from estimator_dist import preflight

    args = list(train_args)
    if not any(arg.startswith("--model_dir") for arg in args):
        args.append("--model_dir=/nonexistent/estimator_dist_check")
    return list(preflight.preflight(job_from_args(args), num_workers).pitfalls)


def main(argv: Sequence[str]) -> int:
    """Prints one line per pitfall; exits 2 when one is fatal."""
    from estimator_dist.base.errors import UsageError

    train_args = list(argv[1:])
    if not train_args and not _SCRIPT.value:
        cli.usage_exit(
            PROGRAM, "nothing to check: give --script=FILE and/or training flags after '--'."
        )
    try:
        verdicts, found = check_scripts(_SCRIPT.value)
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
