"""Whether `--script` or `--module` can run a program, read from its source without running it.

A call counts only when it is TensorFlow's: names are resolved through the
program's imports (`import tensorflow as tf`, `from tensorflow.estimator import
train_and_evaluate as tae`, `from tensorflow_estimator ... import ...`, `from .
import model`), so the program's own `def train_and_evaluate(args)` is not
taken for TensorFlow's. Modules of the program (the script's directory, or the
package path) are read too; a name that comes from anywhere else cannot be
followed statically, and the verdict says so rather than guess.

The verdict's rules are one table, `RULES`: the first kind of finding present
decides the answer; the kinds with no answer are only information (`Scan.per_file`).

>>> scan = scan_sources({"__main__": ("train.py",
...     "import tensorflow as tf\\ntf.estimator.train_and_evaluate(e, t, v)\\n")})
>>> print(verdict(scan, "--script"))
will run with --script: yes (calls tf.estimator.train_and_evaluate at line 2)
"""

from __future__ import annotations

import ast
import dataclasses
import os
from typing import Dict, List, Optional, Sequence, Set, Tuple

from estimator_dist.task.pitfalls import NO_INPUT_CONTEXT, Pitfall

YES, NO, UNKNOWN = "yes", "no", "cannot tell statically"
#: Top-level modules whose names are TensorFlow's.
TF_ROOTS = ("tensorflow", "tensorflow_estimator")
#: Last parts of the names of TensorFlow's Estimator constructors.
_ESTIMATOR_SUFFIXES = ("Estimator", "Classifier", "Regressor")
#: Keyword arguments that mark a call of `Estimator.train`/`evaluate`.
_ESTIMATOR_KEYWORDS = {"input_fn", "steps", "max_steps", "hooks", "checkpoint_path"}


@dataclasses.dataclass(frozen=True)
class Rule:
    """One row of the verdict's table.

    Attributes:
      kind: The finding it applies to.
      answer: YES, NO or UNKNOWN when a finding of this kind decides the verdict
        (the first such row present wins), None when it is only information.
      text: What the verdict or the report says; `{where}` is the place.
    """

    kind: str
    answer: Optional[str]
    text: str


SEGMENT = "each call runs as one synchronised segment on every worker"
#: The verdict's rules, in order.
RULES: Tuple[Rule, ...] = (
    Rule("train-and-evaluate", YES, "calls tf.estimator.train_and_evaluate at {where}"),
    Rule("estimator-train", YES, f"trains with estimator.train() at {{where}}: {SEGMENT}"),
    Rule(
        "unresolved-train-and-evaluate",
        UNKNOWN,
        "train_and_evaluate(...) at {where} comes from {origin}, which it did not read; "
        "nothing it read calls TensorFlow's",
    ),
    Rule(
        "unresolved-estimator-train",
        UNKNOWN,
        "{call} at {where} may be an Estimator's train(): the object comes from {origin}, "
        "which it cannot follow",
    ),
    Rule(
        "estimator-evaluate", None, f"evaluates with estimator.evaluate() at {{where}}: {SEGMENT}"
    ),
    Rule(
        "no-max-steps",
        None,
        "TrainSpec(...) at {where} sets no max_steps: training runs until its input ends, "
        "and every worker must then end at the same step",
    ),
)
#: The verdict when no rule decides.
NO_CALL = (
    "it never calls tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec) nor "
    "an Estimator's train(), the calls {flag} distributes; train and evaluate through them"
)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A call (or a TrainSpec) the verdict reads: where it is, and what it is."""

    file: str
    line: int
    kind: str
    call: str = ""
    origin: str = ""

    def text(self, where: str) -> str:
        rule = next(rule for rule in RULES if rule.kind == self.kind)
        return rule.text.format(where=where, call=self.call, origin=self.origin)


@dataclasses.dataclass(frozen=True)
class Scan:
    """What the program's files hold: the files read, in order, and the findings of each."""

    files: Tuple[str, ...]
    findings: Tuple[Finding, ...]

    def where(self, finding: Finding) -> str:
        if len(self.files) == 1:
            return f"line {finding.line}"
        return f"{finding.file}:{finding.line}"

    def per_file(self) -> List[str]:
        """One line per file read: its findings, or that it has none."""
        lines = []
        for file in self.files:
            found = [f for f in self.findings if f.file == file]
            text = "; ".join(f.text(f"line {f.line}") for f in found)
            lines.append(
                f"  {file}: {text or 'no TensorFlow train_and_evaluate/train/evaluate call'}"
            )
        return lines


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the program can run, with the reason; its `str` is the line shown to the user."""

    answer: str
    reason: str
    flag: str = "--script"

    @property
    def runs(self) -> bool:
        return self.answer == YES

    def __str__(self) -> str:
        if self.answer == YES:
            return f"will run with {self.flag}: yes ({self.reason})"
        return f"will run with {self.flag}: {self.answer}: {self.reason}"


def verdict(scan: Scan, flag: str = "--script") -> Verdict:
    """The first rule of `RULES` that a finding of `scan` matches decides; else no."""
    for rule in RULES:
        found = [f for f in scan.findings if f.kind == rule.kind]
        if rule.answer is not None and found:
            return Verdict(rule.answer, found[0].text(scan.where(found[0])), flag)
    return Verdict(NO, NO_CALL.format(flag=flag), flag)


def _dotted(node: ast.AST) -> Optional[List[str]]:
    """`a.b.c` as ['a', 'b', 'c'], or None for anything else."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else [*base, node.attr]
    return None


def _is_tf(name: Optional[str]) -> bool:
    return bool(name) and name.split(".")[0] in TF_ROOTS


def _is_estimator_class(name: Optional[str]) -> bool:
    last = (name or "").rsplit(".", 1)[-1]
    return _is_tf(name) and (last.endswith(_ESTIMATOR_SUFFIXES) or last == "model_to_estimator")


class _Module:
    """One file: what its names are bound to."""

    def __init__(self, name: str, file: str, source: str, package: str) -> None:
        self.name, self.file, self.package = name, file, package
        self.tree = ast.parse(source, file)
        self.names: Dict[str, str] = {}
        self.stars: List[str] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    self.names[bound] = alias.name if alias.asname else bound
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(node)
                for alias in node.names:
                    if alias.name == "*":
                        self.stars.append(base)
                    else:
                        self.names[alias.asname or alias.name] = f"{base}.{alias.name}".strip(".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.names.setdefault(node.name, f"{name}.{node.name}")
        for node in ast.walk(self.tree):  # Aliases: `tae = tf.estimator.train_and_evaluate`.
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], self.resolve(node.value)
                if isinstance(target, ast.Name) and value and target.id not in self.names:
                    self.names[target.id] = value

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.package.split(".") if self.package else []
        parts = parts[: len(parts) - node.level + 1] if node.level > 1 else parts
        return ".".join([*parts, *([node.module] if node.module else [])])

    def resolve(self, node: ast.AST) -> Optional[str]:
        """The full dotted name `node` refers to, when the imports say it."""
        parts = _dotted(node)
        if not parts:
            return None
        bound = self.names.get(parts[0])
        if bound is None and self.stars:
            bound = f"{self.stars[0]}.{parts[0]}"
        return None if bound is None else ".".join([bound, *parts[1:]])

    def imported(self) -> Set[str]:
        found = {value for value in self.names.values() if not value.startswith(self.name + ".")}
        return found | set(self.stars)


def _is_estimator_call(node: ast.Call) -> Optional[str]:
    """`train` or `evaluate` when `node` looks like `Estimator.train`/`evaluate` (not Keras')."""
    function = node.func
    if not isinstance(function, ast.Attribute) or function.attr not in ("train", "evaluate"):
        return None
    if {keyword.arg for keyword in node.keywords} & _ESTIMATOR_KEYWORDS:
        return function.attr
    if function.attr == "train":
        return function.attr if node.args else None
    first = node.args[0] if node.args else None
    named = getattr(first, "id", None) or getattr(first, "attr", None) or ""
    return function.attr if isinstance(first, ast.Lambda) or "input" in named else None


class _Program:
    """Every module read, and which of their functions return a TensorFlow Estimator."""

    def __init__(self, modules: Sequence[_Module]) -> None:
        self.modules = list(modules)
        self.tops = {module.name.split(".")[0] for module in modules}
        self.factories: Set[str] = set()
        for module in self.modules:
            for node in ast.walk(module.tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for inner in ast.walk(node):
                        if isinstance(inner, ast.Return) and isinstance(inner.value, ast.Call):
                            if _is_estimator_class(module.resolve(inner.value.func)):
                                self.factories.add(f"{module.name}.{node.name}")

    def own(self, name: Optional[str]) -> bool:
        return bool(name) and name.split(".")[0] in self.tops

    def _makes_estimator(self, module: _Module, call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        made = module.resolve(call.func)
        return _is_estimator_class(made) or made in self.factories

    def findings(self, module: _Module) -> List[Finding]:
        estimators: Dict[str, str] = {}  # Receiver name to where its value comes from.
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                key = ".".join(_dotted(node.targets[0]) or [""])
                if key and self._makes_estimator(module, node.value):
                    estimators[key] = ""
                elif key and isinstance(node.value, ast.Call):
                    made = module.resolve(node.value.func) or ".".join(
                        _dotted(node.value.func) or ["a call"]
                    )
                    estimators.setdefault(key, f"{made}()")
        found = []
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Call):
                continue
            line = node.lineno
            parts = _dotted(node.func) or [""]
            name = module.resolve(node.func)
            called = (name or ".".join(parts)).rsplit(".", 1)[-1]
            if called == "train_and_evaluate":
                if _is_tf(name):
                    found.append(Finding(module.file, line, "train-and-evaluate"))
                elif not self.own(name):
                    origin = name.rpartition(".")[0] if name else f"`{'.'.join(parts)}`"
                    origin = f"module {origin}" if name else f"{origin}, bound at run time"
                    found.append(
                        Finding(module.file, line, "unresolved-train-and-evaluate", origin=origin)
                    )
            elif called == "TrainSpec" and _is_tf(name):
                keywords = {keyword.arg for keyword in node.keywords}
                splat = None in keywords or any(isinstance(a, ast.Starred) for a in node.args)
                if not splat and "max_steps" not in keywords and len(node.args) < 2:
                    found.append(Finding(module.file, line, "no-max-steps"))
            method = _is_estimator_call(node)
            if method:
                receiver = node.func.value  # type: ignore[attr-defined]
                key = ".".join(_dotted(receiver) or [""])
                origin = estimators.get(key)
                if self._makes_estimator(module, receiver) or origin == "":
                    found.append(Finding(module.file, line, f"estimator-{method}"))
                elif method == "train":
                    origin = origin or f"`{key or 'an expression'}`, bound at run time"
                    call = f"{key or '(...)'}.train(...)"
                    found.append(
                        Finding(module.file, line, "unresolved-estimator-train", call, origin)
                    )
        return sorted(found, key=lambda finding: finding.line)

    def scan(self) -> Scan:
        findings = [finding for module in self.modules for finding in self.findings(module)]
        return Scan(tuple(module.file for module in self.modules), tuple(findings))


def scan_sources(sources: Dict[str, Tuple[str, str]], package: str = "") -> Scan:
    """Scans given sources: module name to (file name shown, source).

    Raises:
      SyntaxError: if a source is not Python.
    """
    modules = []
    for name, (file, source) in sources.items():
        own_package = name if file.endswith("__init__.py") else name.rpartition(".")[0]
        modules.append(_Module(name, file, source, own_package if name != "__main__" else package))
    return _Program(modules).scan()


def _package_files(root: str, top: str) -> Dict[str, str]:
    """Module name to path of every .py file of top-level package (or module) `top` under `root`."""
    directory = os.path.join(root, top)
    if not os.path.isdir(directory):
        path = directory + ".py"
        return {top: path} if os.path.isfile(path) else {}
    files = {}
    for here, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d.isidentifier())
        for name in sorted(names):
            if name.endswith(".py") and name[:-3].isidentifier():
                parts = os.path.relpath(os.path.join(here, name[:-3]), root).split(os.sep)
                files[".".join(parts).removesuffix(".__init__")] = os.path.join(here, name)
    return files


def scan_program(root: str, script: Optional[str] = None, module: Optional[str] = None) -> Scan:
    """Scans a script (as `__main__`) or a module's top-level package, and the modules of
    `root` (the script's directory, or the package path) that they import.

    Raises:
      OSError: if a file cannot be read.
      SyntaxError: if a file is not Python.
    """
    paths: Dict[str, str] = {"__main__": script} if script else {}
    if module:
        paths.update(_package_files(root, module.split(".")[0]))
    modules: List[_Module] = []
    pending = list(paths.items())
    while pending:
        name, path = pending.pop(0)
        with open(path, encoding="utf-8") as stream:
            source = stream.read()
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        shown = os.path.relpath(path, root) if module else path
        modules.append(_Module(name, shown, source, package))
        for imported in sorted(modules[-1].imported()):
            top = imported.split(".")[0]
            if top and not _is_tf(top) and top not in {n.split(".")[0] for n in paths}:
                found = _package_files(root, top)
                paths.update(found)
                pending += list(found.items())
    return _Program(modules).scan()


# --- the pitfalls of a program's source ---------------------------------------------

#: `save_checkpoints_secs` in a program's own RunConfig: what TensorFlow does with it on a cluster.
CHECKPOINT_SECS_PROGRAM = (
    "{where}save_checkpoints_secs: on a cluster TensorFlow checkpoints every 1000 steps instead "
    "(MonitoredSession's rule for collective strategies, whose workers must save at the same "
    "step; it logs 'Collective ops may deadlock with save_checkpoints_secs'); the last step is "
    "still checkpointed and evaluated. To choose the interval, give save_checkpoints_steps."
)
#: `estimator.train` and `estimator.evaluate` in a script's source: information, not an error.
ESTIMATOR_SEGMENT = (
    "{where}calls estimator.{method}(...): on a cluster each call runs as one synchronised "
    "segment on every worker, so every worker must make the same calls with the same steps. "
    "tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec) does both in one run, "
    "the evaluator evaluating each checkpoint while the workers train."
)
#: A TrainSpec without `max_steps`.
NO_MAX_STEPS = (
    "{where}TrainSpec(...) sets no max_steps, so training runs until the input ends. On a "
    "cluster every training task counts its input before training and all stop at the fewest "
    "batches any of them has (the rest of a longer shard is not trained); an input that never "
    "ends, or a cluster with parameter servers, needs TrainSpec(input_fn, max_steps=N)."
)

#: A `tf.distribute.Server` the program starts itself: TensorFlow's one request pool per process.
IN_PROCESS_SERVER = (
    "{where}starts a tf.distribute.Server. Every server of a process handles requests on one "
    "TensorFlow thread pool, sized by the first server created: on a cluster that is the "
    "Estimator's (1 thread on a task pinned to one core), so an in-process "
    "ParameterServerStrategy cluster started after it hangs in its first step with fewer "
    "threads than its in-process workers + 1. Set TF_NUM_INTEROP_THREADS to at least that in "
    "the launcher's environment, or run that part in its own process."
)
#: Modules whose `Server` is TensorFlow's: `tf.distribute`, `tf.train` and their compat paths.
_SERVER_MODULES = {"distribute", "train", "server_lib"}


def _called_name(node: ast.Call) -> Optional[str]:
    function = node.func
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def _is_tf_server(node: ast.Call) -> bool:
    """Whether `node` makes a TensorFlow server: `tf.distribute.Server(...)`, `Server(...)`."""
    dotted = _dotted(node.func)
    if not dotted or dotted[-1] != "Server":
        return False
    return len(dotted) == 1 or dotted[-2] in _SERVER_MODULES


def scan_source(source: str, filename: str = "<script>") -> List[Pitfall]:
    """Finds multi-worker pitfalls in the source of a legacy Estimator script.

    Looks for `<estimator>.train(...)` calls (any call of a `train` attribute
    with arguments) and `<estimator>.evaluate(...)` calls (with Estimator's
    keywords or an input function), `save_checkpoints_secs=` in any call (a
    warning: TensorFlow checkpoints by steps instead on a cluster),
    `TrainSpec(...)` without `max_steps`, servers the program starts itself
    (`tf.distribute.Server(...)`: on a cluster they share the Estimator's
    server's thread pool), and training input_fns that take no
    `input_context`: the functions the source hands `TrainSpec` or `train()`
    (by name, or called in a lambda), else those whose name ends in
    `input_fn` and says neither eval, serving nor predict.

    Args:
      source: Python source code.
      filename: Shown in the messages.

    Returns:
      The pitfalls, in source order.

    Raises:
      SyntaxError: if `source` is not Python.
    """
    return [pitfall for _, pitfall in _scan(ast.parse(source, filename), filename)]


def _scan(tree: ast.AST, filename: str) -> List[Tuple[int, Pitfall]]:
    """`scan_source` with the line of each pitfall, in source order."""
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        where = f"{filename}:{line}: "
        if isinstance(node, ast.Call):
            keywords = {keyword.arg for keyword in node.keywords}
            method = _is_estimator_call(node)
            if method:
                message = ESTIMATOR_SEGMENT.format(where=where, method=method)
                found.append((line, Pitfall(f"estimator-{method}", message, False)))
            # A `**kwargs` or `*args` argument may hold max_steps.
            splat = None in keywords or any(isinstance(a, ast.Starred) for a in node.args)
            spec_without_steps = not splat and "max_steps" not in keywords and len(node.args) < 2
            if _called_name(node) == "TrainSpec" and spec_without_steps:
                message = NO_MAX_STEPS.format(where=where)
                found.append((line, Pitfall("no-max-steps", message, False)))
            if "save_checkpoints_secs" in keywords:
                message = CHECKPOINT_SECS_PROGRAM.format(where=where)
                found.append((line, Pitfall("checkpoint-secs", message, False)))
            if _is_tf_server(node):
                message = IN_PROCESS_SERVER.format(where=where)
                found.append((line, Pitfall("in-process-server", message, False)))
    training = _training_inputs(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = [a.arg for a in node.args.args + node.args.kwonlyargs]
            if _trains_on(node.name, training) and "input_context" not in arguments:
                where = f"{filename}:{node.lineno}: "
                message = NO_INPUT_CONTEXT.format(name=f"{where}{node.name}", workers="N")
                found.append((node.lineno, Pitfall("no-input-context", message, False)))
    return sorted(found, key=lambda item: item[0])


def _training_inputs(tree: ast.AST) -> set:
    """Names of the functions the source hands `TrainSpec(...)` or `<estimator>.train(...)`.

    The input argument itself when it is a name, or the functions a lambda
    passed there calls.
    """
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if _called_name(node) != "TrainSpec" and _is_estimator_call(node) != "train":
            continue
        given = [k.value for k in node.keywords if k.arg == "input_fn"] + node.args[:1]
        for value in given:
            if isinstance(value, ast.Lambda):
                names |= {
                    name
                    for call in ast.walk(value.body)
                    if isinstance(call, ast.Call) and (name := _called_name(call))
                }
            elif isinstance(value, (ast.Name, ast.Attribute)):
                names.add(value.id if isinstance(value, ast.Name) else value.attr)
    return names


def _trains_on(name: str, training: set) -> bool:
    """Whether the function `name` is a training input: named so, or by its name's words."""
    if training:
        return name in training
    lowered = name.lower()
    others = ("eval", "serving", "serve", "predict", "test")
    return lowered.endswith("input_fn") and not any(word in lowered for word in others)


def script_verdict(source: str, filename: str = "<script>") -> Verdict:
    """Reads one script's source and says whether `--script` can run it (`program_scan`).

    Raises:
      SyntaxError: if `source` is not Python.
    """
    return verdict(scan_sources({"__main__": (filename, source)}))
