"""Where a job's results live: its model_dir, and the object storage that keeps them.

`ResultsConfig` is nested in the configuration of every program that runs a
job (`estimator_dist.config.job.JobConfig` for named functions,
`estimator_dist.programs.config.ScriptConfig` for a whole program), so
`--model_dir` and `--storage` are declared once. No TensorFlow import.

>>> ResultsConfig("/tmp/run1", "s3://bucket/run1").storage
's3://bucket/run1'
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import setting
from estimator_dist.storage.location import place


@dataclasses.dataclass(frozen=True)
class ResultsConfig:
    """The job's model_dir and where its results live.

    Attributes:
      model_dir: The job's directory of checkpoints, summaries and results:
        a path every task reaches, or a URL (`estimator_dist.storage`). A
        named-functions job needs one; a whole program may leave it to the
        program's own RunConfig, and when given, its estimators must write at
        or below it.
      storage: URL where the job's results live while `model_dir` is a
        local path on each task's machine, or None.
    """

    model_dir: Optional[str] = setting(
        None,
        "Directory of the job's checkpoints, summaries and results, reached by every task (or "
        "a URL, see --storage); estimator_dist.train needs one. For a program "
        "(--script/--module): the directory its "
        "estimators must write at or below (a task whose estimator uses another one fails at "
        "once, exit 2), default the program's own; the launcher writes logs/ there and reads "
        "the checkpoint step from it.",
        kind="string",
    )
    storage: Optional[str] = setting(
        None,
        "URL where the job's results live (s3://bucket/run1, gs://..., az://...) while "
        "--model_dir is a local path on each task's machine: no shared file system needed. A "
        "--model_dir=s3://... works this way by itself. See docs/running.md.",
        kind="string",
    )

    def __post_init__(self) -> None:
        if self.model_dir is not None and not self.model_dir:
            raise UsageError(
                "--model_dir is empty; expected the directory of the job's checkpoints, such "
                "as --model_dir=/tmp/run1."
            )
        if self.storage and not self.model_dir:
            raise UsageError(
                f"--storage={self.storage} needs --model_dir, the local directory each task "
                "works in on its machine; pass e.g. --model_dir=/tmp/run1."
            )
        if self.model_dir:
            place(self.model_dir, self.storage)
