"""Mixed precision: what `--mixed_precision` becomes on this machine, and the sessions' rewrite.

No TensorFlow import at module level: `run_config.options` lists the values
for the flags without it.

The package changes no model: it turns on one of TensorFlow 2.15's grappler
rewrites in the session config of every training and evaluation session, so
users' model_fns, canned estimators and Keras models all get it.

* `bfloat16`: `auto_mixed_precision_onednn_bfloat16`. On a CPU with
  AVX-512 BF16 or AMX, oneDNN's convolutions and matmuls compute in bfloat16
  (casts are inserted around them in the graph); variables, gradients, the
  all-reduce, checkpoints and exports stay float32 (the rewrite touches the
  session's graph, not the saved one). Elsewhere the rewrite would emulate
  bfloat16 and be slower, so it is refused (exit 2), naming the CPU's flags.
* `float16`: `auto_mixed_precision`, the CUDA rewrite
  `tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite` turns
  on, for GPUs of compute capability 7.0 or more; float16 gradients can
  underflow, so the optimizer must scale the loss dynamically:
  `model_fns.optimizers.loss_scaled` wraps a `tf.compat.v1.train` optimizer
  as that function does (the shipped model_fns wrap theirs through
  `model_fns.optimizers.with_gradient_accumulation`), and Keras
  models are built under the `mixed_float16` policy (`keras_policy`), whose
  `compile` wraps their optimizer.
* `auto`: float16 on such GPUs, else bfloat16 on such a CPU, else off.

`decide` makes the choice from the CPU's flags and the GPUs' compute
capabilities, given, so it is tested without the hardware:

>>> decide("auto", cpu_flags={"avx2", "avx512_bf16"}, gpus=(), onednn=True).used
'bfloat16'
>>> decide("auto", cpu_flags={"avx2"}, gpus=((8, 0),), onednn=True).used
'float16'
>>> print(decide("auto", cpu_flags={"avx2"}, gpus=(), onednn=True).reason)
auto: no GPU of compute capability 7.0+ and no CPU flag of avx512_bf16, amx_bf16: float32
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Collection, Iterator, Optional, Sequence, Tuple

from estimator_dist.base.errors import UsageError
from estimator_dist.hardware import cpus

if TYPE_CHECKING:
    import tensorflow as tf

OFF = "off"
BFLOAT16 = "bfloat16"
FLOAT16 = "float16"
AUTO = "auto"
#: Values of `--mixed_precision`, the default first.
MIXED_PRECISIONS = (OFF, BFLOAT16, FLOAT16, AUTO)
#: The least compute capability whose tensor cores compute in float16.
MIN_CAPABILITY = (7, 0)
#: The Keras policy of a precision that needs one (bfloat16's rewrite covers Keras models).
KERAS_POLICIES = {FLOAT16: "mixed_float16"}

Capability = Tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Precision:
    """What a job computes in on this machine, and why.

    Attributes:
      requested: `--mixed_precision` as given (`off`, `bfloat16`, `float16`, `auto`).
      used: What the sessions compute in: `off` (float32), `bfloat16` or `float16`.
      reason: One line: the hardware that decided it.
    """

    requested: str
    used: str
    reason: str

    def to_record(self) -> dict:
        """The run record's entry.

        >>> Precision("auto", "off", "no GPU").to_record()["variables"]
        'float32'
        """
        return {
            "requested": self.requested,
            "used": self.used,
            "reason": self.reason,
            "variables": "float32",
            "graph_rewrite": _REWRITES.get(self.used),
        }


#: The grappler option each precision turns on.
_REWRITES = {BFLOAT16: "auto_mixed_precision_onednn_bfloat16", FLOAT16: "auto_mixed_precision"}


def _bfloat16_flags(cpu_flags: Collection[str]) -> Tuple[str, ...]:
    return tuple(flag for flag in cpus.BFLOAT16_FLAGS if flag in cpu_flags)


def _shown_flags(cpu_flags: Collection[str]) -> str:
    """The vector and matrix flags of `cpu_flags`, what decides bfloat16 (all if none)."""
    vector = sorted(f for f in cpu_flags if f.startswith(("avx", "amx", "sse4", "fma")))
    return ", ".join(vector) or "none"


def _fast_gpus(gpus: Sequence[Capability]) -> bool:
    return bool(gpus) and all(tuple(capability) >= MIN_CAPABILITY for capability in gpus)


def decide(
    requested: str, cpu_flags: Collection[str], gpus: Sequence[Capability], onednn: bool
) -> Precision:
    """Decides what `--mixed_precision=requested` computes in on this hardware.

    Args:
      requested: `off`, `bfloat16`, `float16` or `auto`.
      cpu_flags: The CPU's instruction-set flags (`estimator_dist.hardware.cpus.cpu_flags`).
      gpus: The compute capability `(major, minor)` of each GPU the task trains on.
      onednn: Whether TensorFlow runs oneDNN kernels (`--onednn`), which the
        bfloat16 rewrite needs.

    Returns:
      The decision, with its reason.

    Raises:
      UsageError: for `bfloat16` without a CPU (or oneDNN) that computes in
        it, and `float16` without GPUs of compute capability 7.0 or more.
    """
    if requested not in MIXED_PRECISIONS:
        raise UsageError(
            f"--mixed_precision={requested} is not a precision; expected one of "
            f"{', '.join(MIXED_PRECISIONS)}."
        )
    native = _bfloat16_flags(cpu_flags)
    shown = ", ".join(f"{major}.{minor}" for major, minor in gpus) or "none"
    if requested == OFF:
        return Precision(requested, OFF, "--mixed_precision=off: float32")
    if requested == BFLOAT16:
        if not native:
            raise UsageError(
                "--mixed_precision=bfloat16 needs a CPU that computes in bfloat16 (flag "
                f"{' or '.join(cpus.BFLOAT16_FLAGS)} in /proc/cpuinfo), where the rewrite is "
                f"about 2.5-3x faster; this CPU reports {_shown_flags(cpu_flags)}, on which "
                "bfloat16 is emulated and slower than float32. Use --mixed_precision=off (or "
                "auto, which falls back to float32), or a machine with AVX-512 BF16 or AMX "
                "(Intel Cooper Lake, Sapphire Rapids or later; AMD Zen 4 or later)."
            )
        if not onednn:
            raise UsageError(
                "--mixed_precision=bfloat16 runs oneDNN's bfloat16 kernels, but oneDNN is off "
                "(--onednn=off, or TF_ENABLE_ONEDNN_OPTS=0 in the environment); expected it on. "
                "Use --onednn=on (or auto without TF_ENABLE_ONEDNN_OPTS=0), or "
                "--mixed_precision=off."
            )
        return Precision(requested, BFLOAT16, f"CPU flags {', '.join(native)}: bfloat16")
    if requested == FLOAT16:
        if not _fast_gpus(gpus):
            raise UsageError(
                "--mixed_precision=float16 needs GPUs of compute capability "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or more (Volta and later), whose "
                f"tensor cores compute in float16; this task trains on GPUs of capability "
                f"{shown}. Use --mixed_precision=bfloat16 on a CPU with AVX-512 BF16 or AMX, "
                "auto, or off."
            )
        return Precision(requested, FLOAT16, f"GPU compute capability {shown}: float16")
    if _fast_gpus(gpus):
        return Precision(requested, FLOAT16, f"auto: GPU compute capability {shown}: float16")
    if native and onednn:
        return Precision(requested, BFLOAT16, f"auto: CPU flags {', '.join(native)}: bfloat16")
    missing = "oneDNN off" if native else f"no CPU flag of {', '.join(cpus.BFLOAT16_FLAGS)}"
    return Precision(
        requested, OFF, f"auto: no GPU of compute capability 7.0+ and {missing}: float32"
    )


def gpu_capabilities(num_gpus: Optional[int] = None) -> Tuple[Capability, ...]:
    """The compute capability of each GPU a task trains on: the visible ones, the first `num_gpus`.

    `run_config.gpus.use_gpus` has made only a task's GPUs visible by then.
    """
    import tensorflow as tf

    found = tf.config.get_visible_devices("GPU")[:num_gpus]
    details = (tf.config.experimental.get_device_details(gpu) for gpu in found)
    return tuple(tuple(d.get("compute_capability", (0, 0))) for d in details)  # type: ignore


def resolve(requested: str, num_gpus: Optional[int] = None) -> Precision:
    """Decides `requested` on this machine: its CPU flags, oneDNN, the GPUs the task trains on.

    Raises:
      UsageError: as `decide`.
    """
    if requested == OFF:
        return decide(OFF, (), (), onednn=False)
    gpus = gpu_capabilities(num_gpus) if requested in (FLOAT16, AUTO) else ()
    return decide(requested, cpus.cpu_flags(), gpus, cpus.onednn_enabled())


def rewrite_session_config(
    precision: Precision, session_config: tf.compat.v1.ConfigProto, distributed: bool
) -> tf.compat.v1.ConfigProto:
    """A copy of `session_config` with the grappler rewrite of `precision` turned on.

    MultiWorkerMirroredStrategy's `update_config_proto` copies the rewrite
    options it is given and adds its own, so the rewrite reaches the
    multi-worker sessions too. There, TensorFlow 2.15 fails the first step
    of a bfloat16 graph with grappler's remapper on: the remapper fuses a
    bfloat16 convolution, bias and activation into `_FusedConv2D`, and every
    task's `GraphMgr::InitItem` (graph_mgr.cc, on RegisterGraph) validates
    each node against its OpDef (`validate_nodes`), whose `T` has no
    bfloat16, before oneDNN's layout pass (POST_PARTITIONING, later in the
    same function) would rename it to its own kernel, as a one-process
    session does. So on a task of a cluster (`distributed`) bfloat16 turns
    the remapper off; in one process it stays on, and faster. No session
    setting keeps it (docs/performance.md, "The rewrite in a multi-worker
    session").

    Args:
      precision: What the sessions compute in.
      session_config: The config to start from; not changed.
      distributed: Whether the sessions are those of a task of a cluster.

    >>> import tensorflow as tf
    >>> config = rewrite_session_config(Precision("bfloat16", "bfloat16", ""),
    ...                                 tf.compat.v1.ConfigProto(), distributed=True)
    >>> options = config.graph_options.rewrite_options
    >>> options.auto_mixed_precision_onednn_bfloat16 == options.ON, options.remapping == options.OFF
    (True, True)
    """
    updated = type(session_config)()
    updated.CopyFrom(session_config)
    rewrites = updated.graph_options.rewrite_options
    option = _REWRITES.get(precision.used)
    if option is not None:
        setattr(rewrites, option, rewrites.ON)
    if precision.used == BFLOAT16 and distributed:
        rewrites.remapping = rewrites.OFF
    return updated


@contextlib.contextmanager
def keras_policy(precision: Precision) -> Iterator[str]:
    """Builds the Keras models inside it under `precision`'s Keras policy; restores the old one.

    With float16, layers compute in float16 with float32 variables, and
    `Model.compile` wraps the optimizer in a dynamic `LossScaleOptimizer`;
    `model_to_estimator` keeps both. Otherwise the policy is left as it is
    (bfloat16's rewrite covers Keras models like any other graph).

    >>> with keras_policy(Precision("float16", "float16", "")) as name:
    ...     print(name)
    mixed_float16
    """
    import tensorflow as tf

    name = KERAS_POLICIES.get(precision.used)
    if name is None:
        yield tf.keras.mixed_precision.global_policy().name
        return
    before = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy(name)
    try:
        yield name
    finally:
        tf.keras.mixed_precision.set_global_policy(before)
