"""CPU settings of a task: oneDNN kernels, and which cores each local task runs on.

**oneDNN.** TensorFlow 2.15 turns its oneDNN (MKL) kernels on by default only
on x86 CPUs with AVX-512 VNNI, AVX-512 BF16 or AMX. Elsewhere, for example on
an AMD EPYC with AVX2 (the machines this package is tested on), it runs
Eigen's kernels, and `TF_ENABLE_ONEDNN_OPTS=1` made one core train
`mnist_cnn` 3.1 times and ResNet-20 about 1.9 times as fast, and the
tabular DNN as fast (docs/performance.md). The variable is read when
TensorFlow is imported, so `configure_onednn` must run before that, which
the entry points do; `--onednn=auto` (the default) keeps a value the
environment already sets and turns oneDNN on otherwise. oneDNN rounds
differently from Eigen (float32 results differ in the last bits), and the
same kernels run on every task, so N-worker and 1-worker runs still match.

**bfloat16.** `cpu_flags` reads the instruction sets the CPU reports
(`/proc/cpuinfo`), and `BFLOAT16_FLAGS` are those with which oneDNN computes
in bfloat16 natively (`estimator_dist.hardware.precision`).

**Cores.** `split_cores` divides the cores a launcher may use among its
training tasks, so that tasks on one machine do not fight over cores and
TensorFlow, which sizes its thread pools from a process's allowed cores,
runs one pool per task's own cores.

>>> split_cores(2, [0, 1, 2, 3])
[frozenset({0, 1}), frozenset({2, 3})]
>>> split_cores(3, [0, 1])
[frozenset({0}), frozenset({1}), frozenset({0})]
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable, FrozenSet, List, MutableMapping, Optional, Sequence, Set

from estimator_dist.base import exit_codes

#: Values of `--onednn`.
ONEDNN_SETTINGS = ("auto", "on", "off")
#: The environment variable TensorFlow reads at import.
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"


def configure_onednn(setting: str, environ: Optional[MutableMapping[str, str]] = None) -> str:
    """Sets `TF_ENABLE_ONEDNN_OPTS` for a TensorFlow not imported yet.

    Args:
      setting: `on`, `off`, or `auto` (keep the environment's value, else on).
      environ: The environment to change; `os.environ` by default.

    Returns:
      The variable's value now: `1` or `0` (or what the environment set).

    Raises:
      ValueError: for another setting, or when TensorFlow is already imported
        in this process and the setting would change nothing.
    """
    if setting not in ONEDNN_SETTINGS:
        raise ValueError(
            f"--onednn must be one of {', '.join(ONEDNN_SETTINGS)}, received {setting!r}."
        )
    environ = os.environ if environ is None else environ
    if setting == "auto":
        value = environ.get(ONEDNN_VARIABLE, "1")
    else:
        value = "1" if setting == "on" else "0"
    if (
        environ is os.environ
        and "tensorflow" in sys.modules
        and environ.get(ONEDNN_VARIABLE) != value
    ):
        raise ValueError(
            f"--onednn={setting} must be applied before TensorFlow is imported, but this process "
            f"imported it already; set {ONEDNN_VARIABLE}={value} in the environment instead."
        )
    environ[ONEDNN_VARIABLE] = value
    return value


def onednn_enabled() -> bool:
    """Whether this process's TensorFlow runs oneDNN kernels (imports TensorFlow)."""
    from estimator_dist.tf_runtime import native

    return native.onednn_enabled()


#: CPU flags with which oneDNN computes in bfloat16 natively (AVX-512 BF16, AMX).
BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
#: Where Linux lists the CPU's flags.
CPUINFO = "/proc/cpuinfo"


def cpu_flags(cpuinfo: str = CPUINFO) -> FrozenSet[str]:
    """The instruction-set flags the CPU reports (the first processor's `flags` line).

    Args:
      cpuinfo: The file to read, `/proc/cpuinfo` by default.

    Returns:
      The flags, empty where the file is missing or lists none (not Linux, not x86).
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                name, colon, value = line.partition(":")
                if colon and name.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def allowed_cores() -> List[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def split_cores(tasks: int, cores: Optional[Sequence[int]] = None) -> List[frozenset]:
    """Divides `cores` (this process's, by default) among `tasks` tasks.

    With at least as many cores as tasks, each task gets its own contiguous
    cores, the first tasks one more when they do not divide evenly; with
    fewer, tasks share single cores round-robin.

    Args:
      tasks: How many tasks, at least 1.
      cores: Core ids; this process's allowed cores when None.

    Returns:
      One set of cores per task.
    """
    cores = list(allowed_cores() if cores is None else cores)
    if tasks > len(cores):
        return [frozenset({cores[i % len(cores)]}) for i in range(tasks)]
    size, extra = divmod(len(cores), tasks)
    sets, start = [], 0
    for index in range(tasks):
        end = start + size + (1 if index < extra else 0)
        sets.append(frozenset(cores[start:end]))
        start = end
    return sets


#: `prctl` option: the signal a process gets when the thread that started it ends.
_PR_SET_PDEATHSIG = 1
# Loaded here, not between fork and exec, where allocating could deadlock.
_LIBC = ctypes.CDLL(None, use_errno=True)


def task_process_setup(cores: Optional[Set[int]], parent: int) -> Callable[[], None]:
    """Returns what a task runs between fork and exec: dies with its launcher, pinned to `cores`.

    The parent death signal follows the thread that started the child, so
    every task is started from the launcher's main thread. A launcher that
    died before the signal was set is caught by comparing the parent's pid.
    """

    def setup() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(exit_codes.FAILURE)
        if cores is not None:
            os.sched_setaffinity(0, cores)

    return setup
