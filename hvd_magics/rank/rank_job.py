"""The job's variables on a rank, parsed in one place into one typed object (:func:`rank_job`).

The driver and the task set them in the rank's environment (:mod:`hvd_magics.protocol` names
each). They are read at each use, not kept: a warm pool's rank sets a cell's own before it runs
it, a zygote's fork sets the rank's, and a test sets them for the code it calls; a copy kept
from before would speak of another cell.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvd_magics.protocol import (ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_TOKEN,
                                 ENV_ENGINE, ENV_EVERY_RESULT, ENV_GROUP_WORLD_SIZE,
                                 ENV_HOROVOD_RANK, ENV_KEEP_STEPS, ENV_KERAS_PROGRESS,
                                 ENV_LOCAL_WORLD_SIZE, ENV_LOOP_PROGRESS, ENV_PREIMPORT,
                                 ENV_RANK, ENV_RANK_TMPDIR, ENV_RESUME_FROM, ENV_RESUME_STEP,
                                 ENV_SHARDS, ENV_SIZE, ENV_STEP_SPLIT, ENV_TF_CONFIG)

#: A job's checkpoint folder when the driver named none (code run outside a job of ours).
DEFAULT_CHECKPOINT_DIR = Path(tempfile.gettempdir()) / "hvd_magics" / "checkpoints" / "default"


def _whole(text: str | None, default: int) -> int:
    return int(text) if text else default


def _tf_task(text: str | None) -> dict[str, Any]:
    """``TF_CONFIG``'s task (``{}`` when it is unset or not JSON: tf.distribute says why)."""
    try:
        task = json.loads(text or "{}").get("task", {})
    except (ValueError, AttributeError):
        return {}
    return task if isinstance(task, dict) else {}


@dataclass(frozen=True)
class RankJob:
    """What the rank knows of its job.

    ``engine`` is ``None`` outside a rank of ours (the guards then change nothing); ``rank``
    is the rank the job started it as (Horovod's own after an elastic reset is Horovod's to
    say); ``resume_step`` is the global step every rank of this attempt resumes from, ``"none"``
    for none, ``None`` when the driver did not say (code outside a job of ours).
    """

    engine: str | None = None
    rank: int = 0
    size: int = 1
    local_size: int = 1
    group_size: int = 1
    attempt: int = 0
    checkpoint_dir: Path = DEFAULT_CHECKPOINT_DIR
    checkpoint_token: str | None = None
    resume_step: str | None = None
    #: ``"memory"``: the resume step was kept in the hosts' memory (``checkpoint.keep``).
    resume_from: str = "file"
    #: Whether the libraries that train (Lightning) keep every step themselves.
    keep_steps: bool = False
    every_result: bool = False
    preimport: tuple[str, ...] = ()
    tmpdir: str | None = None
    shards: list[dict[str, Any]] = field(default_factory=list)
    step_split: bool = True
    loop_progress: bool = True
    keras_progress: bool = True
    tf_task: dict[str, Any] = field(default_factory=dict)

    @property
    def in_a_job(self) -> bool:
        """Whether this process is a rank of ours."""
        return self.engine is not None

    @property
    def first(self) -> bool:
        """Whether this is rank 0 (which writes what one rank writes for all)."""
        return self.rank == 0

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> RankJob:
        """The job's variables in ``environ`` (default: this process's environment)."""
        env = os.environ if environ is None else environ
        return cls(
            engine=env.get(ENV_ENGINE),
            rank=_whole(env.get(ENV_RANK, env.get(ENV_HOROVOD_RANK)), 0),
            size=_whole(env.get(ENV_SIZE), 1),
            local_size=_whole(env.get(ENV_LOCAL_WORLD_SIZE), 1),
            group_size=_whole(env.get(ENV_GROUP_WORLD_SIZE), 1),
            attempt=_whole(env.get(ENV_ATTEMPT), 0),
            checkpoint_dir=Path(env.get(ENV_CHECKPOINT_DIR) or DEFAULT_CHECKPOINT_DIR),
            checkpoint_token=env.get(ENV_CHECKPOINT_TOKEN),
            resume_step=env.get(ENV_RESUME_STEP),
            resume_from=env.get(ENV_RESUME_FROM) or "file",
            keep_steps=env.get(ENV_KEEP_STEPS) == "1",
            every_result=env.get(ENV_EVERY_RESULT) == "1",
            preimport=tuple(n for n in env.get(ENV_PREIMPORT, "").split(",") if n),
            tmpdir=env.get(ENV_RANK_TMPDIR) or None,
            shards=json.loads(env.get(ENV_SHARDS) or "[]"),
            step_split=env.get(ENV_STEP_SPLIT, "1") != "0",
            loop_progress=env.get(ENV_LOOP_PROGRESS, "1") != "0",
            keras_progress=env.get(ENV_KERAS_PROGRESS, "1") != "0",
            tf_task=_tf_task(env.get(ENV_TF_CONFIG)))


def rank_job() -> RankJob:
    """The job's variables as this process's environment says them now."""
    return RankJob.read()
