"""The state one Python process (one kernel) keeps across jobs, in one place.

The magics and :class:`~hvd_magics.job.runner.HorovodRunner` share the one :data:`SESSION`: the
last run (also failed or interrupted ones), what ``%hvd_timeline`` and ``%hvd_mlflow`` turned
on, the warm pool ``%hvd_pool`` started, and which steps each job keeps in the hosts' memory.
Nothing else keeps state between jobs.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from hvd_magics.job.records.mlflow_run import MlflowSettings
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.records.timeline import TimelineSettings
from hvd_magics.launch.environment_shipping import EnvironmentChoice


@dataclass
class Session:
    """What outlives a job in this process."""

    last_run: RunRecord | None = None
    timeline: TimelineSettings = field(default_factory=TimelineSettings)
    #: MLflow tracking for every job (``%hvd_mlflow on``), or ``None``.
    mlflow: MlflowSettings | None = None
    #: The warm pool of ``%hvd_pool start`` (a :class:`hvd_magics.job.pool.HorovodPool`; it may
    #: have ended since), or ``None``.
    pool: Any = None
    #: Every warm pool of this process that has not ended (``%hvd_pool``'s and ``HorovodPool``s
    #: made in Python): a cold job refused for want of slots names the pools that hold them.
    live_pools: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    #: The background jobs that still run (:class:`hvd_magics.job.background.BackgroundJob`).
    background_jobs: set = field(default_factory=set)
    #: The notebook's environment, shipped to the executors for the ranks
    #: (``hvd_magics.ship_environment()``, ``%hvd_env``), or ``None``.
    environment: EnvironmentChoice | None = None
    #: Each job's steps kept in the hosts' memory, by checkpoint folder
    #: (:class:`hvd_magics.job.kept_memory.KeptJob`).
    kept: dict[str, Any] = field(default_factory=dict)

    def held_slots(self, live: Any = None) -> int:
        """The Spark task slots this process's warm pools and background jobs hold, but the
        background job whose :class:`~hvd_magics.job.live_job.LiveJob` is ``live`` (a job's
        own restart needs the slots it held)."""
        return (sum(pool.np for pool in list(self.live_pools) if pool.np > 0)
                + sum(job.spark_slots for job in list(self.background_jobs)
                      if live is None or job.live is not live))

    def reset(self) -> None:
        """Forget the last run, turn the timeline and MLflow tracking off (as in a fresh kernel)."""
        self.last_run = None
        self.timeline = TimelineSettings()
        self.mlflow = None
        self.environment = None
        self.kept = {}
        if self.pool is not None:
            self.pool.close()
        self.pool = None


#: This process's session.
SESSION = Session()
