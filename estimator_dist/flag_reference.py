"""The full flag reference, docs/flags.md, generated from the flag definitions.

  python -m estimator_dist.flag_reference > docs/flags.md    # or: make docs

Each program's flags are read the way that program defines them, without
running it: a module with a `define_flags(flag_values)` function of its own
(`estimator_dist.train`, `estimator_dist.launch`, `estimator_dist.script`,
`estimator_dist.manifest`, `input_fns.convert`, `input_fns.verify`) gets a fresh
`flags.FlagValues`; the others (`estimator_dist.check`, `estimator_dist.predict`)
define theirs on absl's global `flags.FLAGS` when imported. Each program is
read in a Python process of its own, as it runs (two programs defining flags on
the global flags could not share one). The processes only import.

`tests/estimator_dist/flag_reference_test.py` fails when docs/flags.md is not
`render()`, so the reference cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import app, flags

#: The commands that write the reference; the test's failure message names them.
REGENERATE = "`make docs` (or `python -m estimator_dist.flag_reference > docs/flags.md`)"
#: Where the reference lives, relative to the repository root.
DOC_PATH = os.path.join("docs", "flags.md")
#: Packages whose flag-defining modules are this project's (absl's own are left out).
PROJECT_PACKAGES = ("estimator_dist", "input_fns", "run_config", "model_fns", "benchmarks")
#: absl's message for a flag marked as required.
_REQUIRED_MESSAGE = "must have a value other than None"
#: Starts the line on which a reading process prints its flags.
_MARKER = "estimator_dist.flag_reference: "
_READ_TIMEOUT_SECS = 300


@dataclasses.dataclass(frozen=True)
class Program:
    """One command-line program of the reference.

    Attributes:
      module: The module run with `python -m`, such as `estimator_dist.train`.
      usage: Command lines showing where its flags go, one per line.
      note: A sentence or two on flags it takes beyond its own; may be empty.
      flags_module: The module that defines its own flags, when not `module`.
    """

    module: str
    usage: str
    note: str = ""
    flags_module: str = ""

    @property
    def defined_in(self) -> str:
        """The module whose flags are this program's own."""
        return self.flags_module or self.module


PROGRAMS: Tuple[Program, ...] = (
    Program(
        "estimator_dist.train",
        "python -m estimator_dist.train [flags]",
        "The same command runs on every task; `TF_CONFIG` gives each its role.",
        "estimator_dist.config.train_flags",
    ),
    Program(
        "estimator_dist.launch",
        "python -m estimator_dist.launch [launcher flags] -- [estimator_dist.train flags]\n"
        "python -m estimator_dist.launch [launcher flags] --script=train.py "
        "[estimator_dist.script flags] -- [the script's arguments]\n"
        "python -m estimator_dist.launch [launcher flags] --module=trainer.task "
        "[estimator_dist.script flags] -- [the module's arguments]",
        "The flags after `--` are those of [estimator_dist.train](#estimator_disttrain), "
        "checked once here before any task starts; with `--script` or `--module`, they are the "
        "program's own.",
        "estimator_dist.launcher.launch_flags",
    ),
    Program(
        "estimator_dist.manifest",
        "python -m estimator_dist.manifest --name=NAME --image=IMAGE --num_workers=N [flags] "
        "-- [estimator_dist.train flags]\n"
        "python -m estimator_dist.manifest --name=NAME --image=IMAGE --num_workers=N "
        "(--script=PATH | --module=PACKAGE.MODULE) [flags] -- [the program's arguments]",
        "The flags after `--` are those of [estimator_dist.train](#estimator_disttrain), "
        "checked here and given to every replica; with `--script` or `--module` they are the "
        "program's own, and [estimator_dist.script](#estimator_distscript)'s flags go before "
        "`--`; see [kubernetes.md](kubernetes.md).",
    ),
    Program(
        "estimator_dist.script",
        "python -m estimator_dist.script [flags] train.py [the script's arguments]\n"
        "python -m estimator_dist.script [flags] --module=trainer.task -- [the module's arguments]",
        "The flags go before the script's path (or `--`); everything after it is the "
        "program's own.",
        "estimator_dist.programs.config",
    ),
    Program(
        "estimator_dist.check",
        "python -m estimator_dist.check --script=train.py\n"
        "python -m estimator_dist.check --module=trainer.task [--package_path=DIR]\n"
        "python -m estimator_dist.check [flags] -- [estimator_dist.train flags]",
    ),
    Program(
        "estimator_dist.predict",
        "python -m estimator_dist.predict --export_dir=MODEL_DIR [flags]",
    ),
    Program(
        "input_fns.convert",
        "python -m input_fns.convert --source=... --output=DIR --num_shards=N [flags]",
    ),
    Program(
        "input_fns.verify",
        "python -m input_fns.verify (--ids_dir=DIR | --simulate_workers=N) [flags]",
    ),
)


def render() -> str:
    """Builds the Markdown reference of every program's flags.

    Returns:
      The text of docs/flags.md, ending with a newline.

    Raises:
      RuntimeError: if a program's module cannot be imported or its flags read.
    """
    read = read_programs([program.module for program in PROGRAMS])
    lines = [
        "# Flag reference",
        "",
        "Every flag of every program, generated from the flag definitions by "
        "`python -m estimator_dist.flag_reference > docs/flags.md` (`make docs`); "
        "`tests/estimator_dist/flag_reference_test.py` fails when this page is out of date, "
        "so do not edit it by hand. `--helpfull` on any program prints its flags from the same "
        "definitions. "
        "Programs other than `estimator_dist.script` also take absl's logging flags "
        "(`--verbosity`, `--logtostderr`, ...), which are not listed here.",
        "",
        "Booleans are given as `--name` or `--noname`. Enum values are accepted in any case "
        "where the type says so. A usage error (a bad flag or value) exits with code 2.",
        "",
        "| program | what it does |",
        "|---|---|",
    ]
    for program in PROGRAMS:
        summary = _escape(read[program.module]["summary"])
        lines.append(f"| [{program.module}](#{_anchor(program.module)}) | {summary} |")
    for program in PROGRAMS:
        lines.append("")
        lines.extend(render_program(program, read[program.module]))
    return "\n".join(lines) + "\n"


def render_program(program: Program, read: Mapping[str, Any]) -> List[str]:
    """Renders one program's section.

    Args:
      program: The program.
      read: What `read_programs` returned for it: `summary` and `flags`, a
        mapping from each flag-defining module to its flags' descriptions.

    Returns:
      The section's lines.
    """
    own = read["flags"].get(program.defined_in, [])
    lines = [f"## {program.module}", "", read["summary"], "", "```sh", program.usage, "```", ""]
    if program.note:
        lines.extend([program.note, ""])
    lines.extend(_table(own))
    programs = {other.defined_in: other.module for other in PROGRAMS}
    for module, described in read["flags"].items():
        if module == program.defined_in:
            continue
        lines.append("")
        if module in programs:
            names = ", ".join(f"`{_flag_name(flag)}`" for flag in described)
            owner = programs[module]
            lines.append(
                f"It also defines the flags of [{owner}](#{_anchor(owner)}), listed there: {names}."
            )
        else:
            lines.extend([f"It also defines these flags of `{module}`:", ""])
            lines.extend(_table(described))
    return lines


def read_programs(modules: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Reads each module's flags in a Python process of its own, all at once.

    Args:
      modules: Program modules, such as `estimator_dist.launch`.

    Returns:
      For each module, `{"summary": first docstring line, "flags": {defining
      module: [flag description, ...]}}` (see `describe_flag`).

    Raises:
      RuntimeError: if a process fails or prints no description.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    processes = {}
    for module in modules:
        code = f"from estimator_dist import flag_reference; flag_reference._print_flags({module!r})"
        processes[module] = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    read = {}
    try:
        for module, process in processes.items():
            try:
                output, errors = process.communicate(timeout=_READ_TIMEOUT_SECS)
            except subprocess.TimeoutExpired:
                process.kill()
                output, errors = process.communicate()
            lines = [line for line in output.splitlines() if line.startswith(_MARKER)]
            if process.returncode != 0 or not lines:
                raise RuntimeError(
                    f"could not read the flags of {module}: importing it in "
                    f"{sys.executable} exited {process.returncode}.\n{errors[-4000:]}"
                )
            read[module] = json.loads(lines[-1][len(_MARKER) :])
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    return read


def describe_program(module_name: str) -> Dict[str, Any]:
    """Imports a program's module in this process and describes its flags.

    A module with a `define_flags(flag_values)` function (its own, or its
    flags module's) defines its flags on a fresh `flags.FlagValues`; any other module is expected to
    have defined them on `flags.FLAGS` when imported. Call it in a process of
    its own (`read_programs` does): it may define flags on `flags.FLAGS`.

    Args:
      module_name: Such as `estimator_dist.launch`.

    Returns:
      `{"summary": ..., "flags": {defining module: [description, ...]}}`,
      with only this project's modules, each flag in definition order.
    """
    module = importlib.import_module(module_name)
    define = getattr(module, "define_flags", None)
    if callable(define) and getattr(define, "__module__", "").split(".")[0] in PROJECT_PACKAGES:
        flag_values = flags.FlagValues()
        define(flag_values)
    else:
        flag_values = flags.FLAGS
    by_module = {
        name: [describe_flag(flag) for flag in defined]
        for name, defined in flag_values.flags_by_module_dict().items()
        if name.split(".")[0] in PROJECT_PACKAGES
    }
    summary = (module.__doc__ or "").strip().splitlines()
    return {"summary": summary[0] if summary else "", "flags": by_module}


def describe_flag(flag: flags.Flag) -> Dict[str, str]:
    """Describes one flag as the reference shows it.

    Args:
      flag: An absl flag.

    Returns:
      `name`, `boolean` ("yes" or ""), `type`, `default` and `help`, as text.
    """
    required = any(_REQUIRED_MESSAGE in str(getattr(v, "message", "")) for v in flag.validators)
    text = " ".join((flag.help or "").split())
    # absl adds the enum values and "repeat this option" to the help; the type column says so.
    if isinstance(flag.parser, flags.EnumParser):
        text = _remove_prefix(text, f"<{'|'.join(flag.parser.enum_values)}>: ")
    if isinstance(flag, flags.MultiFlag):
        text = _remove_suffix(text, "; repeat this option to specify a list of values")
    return {
        "name": flag.name,
        "boolean": "yes" if flag.boolean else "",
        "type": _type_of(flag),
        "default": "required" if required else _format_default(flag.default),
        "help": text,
    }


def _remove_prefix(text: str, prefix: str) -> str:
    return text[len(prefix) :] if text.startswith(prefix) else text


def _remove_suffix(text: str, suffix: str) -> str:
    return text[: -len(suffix)] if suffix and text.endswith(suffix) else text


def _print_flags(module_name: str) -> None:
    """Prints `describe_program(module_name)` as one JSON line after a marker."""
    described = describe_program(module_name)
    sys.stdout.write(_MARKER + json.dumps(described) + "\n")


def _type_of(flag: flags.Flag) -> str:
    parser = flag.parser
    if flag.boolean:
        return "bool"
    if isinstance(parser, flags.EnumParser):
        values = ", ".join(f"`{value}`" for value in parser.enum_values)
        any_case = "" if parser.case_sensitive else " (any case)"
        return f"one of {values}{any_case}"
    if isinstance(parser, flags.ListParser):
        kind = "comma-separated list"
    elif isinstance(parser, flags.IntegerParser):
        kind = "int"
    elif isinstance(parser, flags.FloatParser):
        kind = "float"
    else:
        kind = "string"
    bounds = []
    if getattr(parser, "lower_bound", None) is not None:
        bounds.append(f">= {_format_number(parser.lower_bound)}")
    if getattr(parser, "upper_bound", None) is not None:
        bounds.append(f"<= {_format_number(parser.upper_bound)}")
    if bounds:
        kind = f"{kind}, {' and '.join(bounds)}"
    if isinstance(flag, flags.MultiFlag):
        kind = f"{kind}; repeatable"
    return kind


def _format_number(value: float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _format_default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _format_number(value)
    if isinstance(value, (list, tuple)):
        return f"`{','.join(str(item) for item in value)}`" if value else "empty"
    if value == "":
        return "empty"
    return f"`{value}`"


def _flag_name(flag: Mapping[str, str]) -> str:
    return f"--[no]{flag['name']}" if flag["boolean"] else f"--{flag['name']}"


def _table(described: Sequence[Mapping[str, str]]) -> List[str]:
    lines = ["| flag | type | default | meaning |", "|---|---|---|---|"]
    for flag in described:
        cells = (f"`{_flag_name(flag)}`", flag["type"], flag["default"], flag["help"])
        lines.append("| " + " | ".join(_escape(cell) for cell in cells) + " |")
    return lines


def _escape(text: str) -> str:
    """Keeps a help text one literal table cell.

    A `|` would end the cell, even in a code span; outside code spans, `<name>`
    would be read as an HTML tag and `*` may start emphasis.
    """
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts)


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than - and _ dropped."""
    kept = "".join(c for c in heading.lower() if c.isalnum() or c in "-_ ")
    return kept.replace(" ", "-")


def main(argv: Sequence[str]) -> Optional[int]:
    """Prints the reference on standard output."""
    if len(argv) > 1:
        raise app.UsageError(
            f"unexpected arguments {list(argv[1:])}; run "
            "`python -m estimator_dist.flag_reference > docs/flags.md`."
        )
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    app.run(main)
