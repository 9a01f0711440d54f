"""The program a `--script` job runs, found by its files: a script, or a module of a package.

Nothing here imports or runs user code: the launcher and `estimator_dist.check`
read these before any task starts, and must not run the user's program or
import TensorFlow. A module is found as `python -m` would find it under one
directory (`--package_path`): each parent a package directory, the last part
`name.py` or a package with `__main__.py`; each file on the way is compiled,
so a syntax error is a usage error here rather than a failed task.

>>> import os, tempfile
>>> root = tempfile.mkdtemp()
>>> os.makedirs(os.path.join(root, "trainer"))
>>> for name in ("__init__.py", "task.py"):
...     open(os.path.join(root, "trainer", name), "w").close()
>>> find_module("trainer.task", root) == os.path.join(root, "trainer", "task.py")
True
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from estimator_dist.base.errors import UsageError
from estimator_dist.programs import scan as program_scan
from estimator_dist.task import pitfalls


def check_script(path: str) -> str:
    """Checks that `path` is a readable Python file; returns its absolute path.

    Raises:
      UsageError: naming the path, what is wrong and the fix.
    """
    absolute = os.path.abspath(path)
    if not os.path.exists(absolute):
        raise UsageError(
            f"--script={path} does not exist (looked for {absolute}). Give the path of the "
            "training script, relative to the current directory or absolute."
        )
    if not os.path.isfile(absolute):
        raise UsageError(f"--script={path} is not a file; give the training script's .py file.")
    _compile(absolute, f"--script={path}")
    return absolute


def _compile(path: str, what: str) -> None:
    """Compiles `path`, refusing a file that is not Python; `what` names it in the message."""
    try:
        with open(path, "rb") as stream:
            compile(stream.read(), path, "exec")
    except OSError as error:
        raise UsageError(f"{what} cannot be read ({path}: {error.strerror}).") from None
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None)
        raise UsageError(
            f"{what} is not a Python script ({path}"
            f"{f', line {line}: {error.msg}' if line else f': {error}'}); give the program's "
            ".py file, or fix it."
        ) from None


def check_package_path(package_path: Optional[str]) -> str:
    """The absolute package path, the current directory by default.

    Raises:
      UsageError: when it is not a directory.
    """
    absolute = os.path.abspath(package_path or os.getcwd())
    if not os.path.isdir(absolute):
        raise UsageError(
            f"--package_path={package_path} is not a directory (looked for {absolute}); "
            "expected the directory that holds the module's top-level package (the one "
            "`python -m` would run from). Fix the path, or leave --package_path out to use "
            "the current directory."
        )
    return absolute


def check_module_name(module: str) -> None:
    """Refuses a module name that `python -m` could not take.

    Raises:
      UsageError: naming the value, what is expected and the fix.
    """
    if not module or not all(part.isidentifier() for part in module.split(".")):
        raise UsageError(
            f"--module={module} is not a module name; expected dotted Python identifiers as "
            "`python -m` takes them, such as --module=trainer.task (not a file path: use "
            "--script=FILE for a file)."
        )


def find_module(module: str, package_path: str) -> str:
    """The file `python -m module` runs from `package_path`, found by files: nothing is imported.

    Each parent must be a package directory; the last part is `name.py` or a
    package directory with `__main__.py`. Every file on the way is compiled.

    Raises:
      UsageError: for a bad name, a missing module, a parent that is not a
        package, or a file that is not Python.
    """
    check_module_name(module)
    parts = module.split(".")
    directory = package_path
    for index, part in enumerate(parts):
        name = ".".join(parts[: index + 1])
        here = os.path.join(directory, part)
        is_package = os.path.isfile(os.path.join(here, "__init__.py")) or (
            os.path.isdir(here) and not os.path.isfile(here + ".py")
        )
        last = index == len(parts) - 1
        if not last and is_package:
            init = os.path.join(here, "__init__.py")
            if os.path.isfile(init):
                _compile(init, f"--module={module}: package {name}'s __init__.py")
            directory = here
        elif not last and os.path.isfile(here + ".py"):
            raise UsageError(
                f"--module={module}: {name} is a module ({here}.py), not a package, so "
                f"{'.'.join(parts[: index + 2])} cannot be inside it; expected a directory "
                f"{here}{os.sep}. Give the module's full dotted name from --package_path, "
                "such as --module=trainer.task."
            )
        elif last and is_package:
            main = os.path.join(here, "__main__.py")
            if not os.path.isfile(main):
                raise UsageError(
                    f"--module={module} is a package ({here}) without __main__.py, so "
                    f"`python -m {module}` cannot run it; expected a module file or a package "
                    f"with __main__.py. Name the module that trains, such as --module="
                    f"{module}.task."
                )
            directory = main
        elif last and os.path.isfile(here + ".py"):
            directory = here + ".py"
        else:
            looked = f"{here}.py and {here}{os.sep}" if last else f"{here}{os.sep}"
            raise UsageError(
                f"--module={module} not found: there is no {name} under --package_path="
                f"{package_path} (looked for {looked}). Expected the directory holding the "
                "top-level package as --package_path (default: the current directory); fix "
                "--package_path or the module's name."
            )
    _compile(directory, f"--module={module}")
    return directory


def program_report(
    script: Optional[str], module: Optional[str], package_path: Optional[str]
) -> Tuple[program_scan.Verdict, program_scan.Scan, List[pitfalls.Pitfall]]:
    """Reads a checked script (or module and its package) without running it.

    Returns:
      The verdict (`--script` or `--module`), the scan of every file read
      (the script's or package's, and the modules of theirs they import), and
      the pre-flight pitfalls of those files.

    Raises:
      UsageError: if a file cannot be read or is not Python.
    """
    root = os.path.abspath(package_path or os.getcwd()) if module else os.path.dirname(script or "")
    try:
        scan = program_scan.scan_program(root or os.curdir, script=script, module=module)
        found = []
        for file in scan.files:
            with open(os.path.join(root, file) if module else file, encoding="utf-8") as stream:
                found += program_scan.scan_source(stream.read(), file)
    except OSError as error:
        raise UsageError(f"{error.filename} cannot be read: {error.strerror}.") from None
    except SyntaxError as error:
        raise UsageError(
            f"{error.filename} is not valid Python (line {error.lineno}: {error.msg})."
        ) from None
    return program_scan.verdict(scan, "--module" if module else "--script"), scan, found
