"""What every command-line program of the package shares: one way to refuse bad usage.

`estimator_dist.train`, `.launch`, `.script`, `.check`, `.predict` and the
data tools `input_fns.convert` and `input_fns.verify` all report a wrong flag
or argument the same way: one line naming the program and what was wrong,
a pointer to `--helpfull`, exit code 2, no traceback.

Example:
  >>> run_program(main, "my_tool")  # doctest: +SKIP
"""

from __future__ import annotations

import sys
from typing import Callable, List, NoReturn, Sequence

from absl import app, flags

from estimator_dist.base.exit_codes import USAGE
from estimator_dist.report import status


def usage_exit(program: str, message: str) -> NoReturn:
    """Prints `program: error: message` and a pointer to --helpfull; exits 2.

    A task under a launcher also tells it why (`status.Exiting`).
    """
    sys.stderr.write(f"{program}: error: {message}\nRun with --helpfull to list every flag.\n")
    status.emit(status.Exiting(exit_code=USAGE, cause=message))
    sys.exit(USAGE)


def make_flags_parser(
    program: str, flag_values: flags.FlagValues = flags.FLAGS
) -> Callable[[Sequence[str]], List[str]]:
    """Returns an `app.run` flags parser that exits 2 on bad flags, with no traceback."""

    def parse(argv: Sequence[str]) -> List[str]:
        try:
            return flag_values(argv)
        except flags.Error as error:
            usage_exit(program, f"{str(error).rstrip('.')}. Fix the flag and run again.")

    return parse


def run_program(main: Callable[[List[str]], int], program: str) -> None:
    """Runs `main` under `absl.app` with the global flags; a bad flag exits 2 (`usage_exit`)."""
    app.run(main, flags_parser=make_flags_parser(program))
