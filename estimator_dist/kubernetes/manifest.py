"""The manifest `python -m estimator_dist.manifest` prints, from its flags and the training flags.

`generate` checks the training flags given after the program's `--` as every
replica will (an unknown flag, a bad value, a strategy that does not fit the
replicas, a global batch that does not divide), except for their data, which
is in the cluster, builds the documents of the `--kind` asked, checks them
against their schemas (`kubernetes.validate`) and returns their YAML and the
warnings for it. With `--script` or `--module` the arguments are the program's
own, checked only for their form. Nothing here imports TensorFlow, and only
the SDK of the kind asked is imported: the program prints its YAML in about a
second (`tests/estimator_dist/manifest_test.py` checks that it imports none).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

from absl import flags

from estimator_dist.base import settings
from estimator_dist.base.errors import UsageError
from estimator_dist.config import train_flags
from estimator_dist.config.train_args import parse_args
from estimator_dist.kubernetes import job_settings, pod, validate
from estimator_dist.kubernetes.job_settings import (
    INDEXED_JOB,
    JOBSET,
    TFJOB,
    TRAINJOB,
    ManifestSettings,
)
from estimator_dist.programs import config as script_config


def parse_train_args(args: Sequence[str]) -> flags.FlagValues:
    """Parses the training flags as `estimator_dist.train` does, absl's own flags included.

    Raises:
      UsageError: for an unknown flag, a bad value, a missing --model_dir or a
        positional argument.
    """
    if not any(arg == "--model_dir" or arg.startswith("--model_dir=") for arg in args):
        raise UsageError(
            "the training flags after '--' set no --model_dir: every replica needs the same "
            "shared one, e.g. `-- --model_dir=gs://bucket/run1`, or a path under a --pvc "
            "mount, e.g. `--pvc=shared-runs:/mnt/runs -- --model_dir=/mnt/runs/run1`."
        )
    return parse_args(args)


def _script_settings(f: flags.FlagValues, args: Sequence[str]) -> ManifestSettings:
    """The manifest of a `--script` or `--module` job, checked without TensorFlow.

    Raises:
      UsageError: for a bad flag, program name, no model_dir, or ps replicas.
    """
    config = script_config.config_from_flags(f, f.script, args, resolve=False)
    program = f"--module={config.module}" if config.module else f"--script={config.path}"
    if f.num_ps:
        raise UsageError(
            f"--num_ps={f.num_ps} with {program}: its replicas train with the strategy "
            "the program's RunConfig sets, or MultiWorkerMirroredStrategy, and a script's "
            "parameter servers need its own ParameterServerStrategy; leave --num_ps out."
        )
    model_dir = config.model_dir or script_config.model_dir_of(args)
    if not model_dir:
        raise UsageError(
            f"{program} needs the shared directory its estimator writes to, and none of "
            f"its arguments after '--' names it ({', '.join(script_config.MODEL_DIR_ARGS)}). "
            "Pass it as --model_dir=DIR before '--', and give the program the same one."
        )
    chosen = f["communication"].present
    strategy = config.strategy
    if f.gpus_per_worker and not chosen:
        strategy = dataclasses.replace(strategy, communication="NCCL")
    config = dataclasses.replace(config.working_in(model_dir), strategy=strategy)
    return settings.from_flags(
        ManifestSettings,
        f,
        model_dir=model_dir,
        train_args=tuple(config.to_args()),
        preemption_grace_secs=config.guards.preemption_grace_secs,
        communication=strategy.communication if chosen else None,
        program=script_config.PROGRAM,
    )


def generate(f: flags.FlagValues, train_args: Sequence[str]) -> Tuple[str, List[str]]:
    """The manifest's YAML and the warnings for it, from parsed manifest flags.

    Raises:
      UsageError: for a bad flag of either program, a job that cannot run, or
        a document its schema refuses.
      Error: if the kind's SDK is missing.
    """
    if f.script or f.module or f.package_path is not None:
        manifest_settings = _script_settings(f, train_args)
        return _checked_yaml(manifest_settings), manifest_settings.warnings()
    given = [name for name in script_config.FLAG_NAMES if f[name].present]
    if given:
        raise UsageError(
            f"--{given[0]} is a flag of --script and --module jobs; for an "
            f"estimator_dist.train job give it after '--' (e.g. `-- --{given[0]}=...`)."
        )
    parsed = parse_train_args(train_args)
    job = train_flags.job_from_flags(parsed, read_data=False)
    chosen = parsed["communication"].present
    manifest_settings = settings.from_flags(
        ManifestSettings,
        f,
        model_dir=job.run.model_dir,
        train_args=tuple(train_args),
        preemption_grace_secs=job.guards.preemption_grace_secs,
        strategy=job.strategy.name,
        communication=job.strategy.communication if chosen else None,
    )
    job_settings.check_train_job(manifest_settings, job)
    return _checked_yaml(manifest_settings), manifest_settings.warnings()


def documents(manifest_settings: ManifestSettings) -> List[Dict[str, Any]]:
    """The kind's documents as `kubectl` reads them, building them with that kind's SDK only.

    Raises:
      Error: if the kind's SDK is missing.
    """
    if manifest_settings.kind == TFJOB:
        from estimator_dist.kubernetes import tfjob

        return [pod.serialize(tfjob.build_tfjob(manifest_settings))]
    if manifest_settings.kind == INDEXED_JOB:
        from estimator_dist.kubernetes import indexed_job

        return [pod.serialize(doc) for doc in indexed_job.build_indexed_jobs(manifest_settings)]
    if manifest_settings.kind == JOBSET:
        from estimator_dist.kubernetes import jobset

        return [jobset.build_jobset(manifest_settings).to_dict()]
    assert manifest_settings.kind == TRAINJOB, manifest_settings.kind
    from estimator_dist.kubernetes import trainjob

    return [doc.to_dict() for doc in trainjob.build_trainjob(manifest_settings)]


def _checked_yaml(manifest_settings: ManifestSettings) -> str:
    built = documents(manifest_settings)
    validate.validate(built)
    return pod.to_yaml(built)
