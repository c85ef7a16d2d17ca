"""What one job needs to start, settled by :class:`hvd_magics.job.runner.HorovodRunner`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from hvd_magics.job.job_state import STALL_AFTER_S, JobView
from hvd_magics.job.live_job import LiveJob
from hvd_magics.job.mlflow_run import MlflowSettings
from hvd_magics.launch.backend import Backend
from hvd_magics.launch.dataframe_input import DataFrameSources
from hvd_magics.launch.payload import JobPayload
from hvd_magics.launch.spark_slots import SLOT_WAIT_S
from hvd_magics.options import DEFAULT_ELASTIC_TIMEOUT_S, ElasticSize
from hvd_magics.protocol import ENV_PREIMPORT
from hvd_magics.result_codec import VALUE, decode_strict

#: ``decode(parts) -> (value, returned)``: what a job's record holds as its ``value`` and its
#: ``returned`` variables, from rank 0's encoded parts (:mod:`hvd_magics.result_codec`).
Decoder = Callable[[dict], "tuple[Any, dict[str, Any]]"]


def decode_value(parts: dict) -> tuple[Any, dict[str, Any]]:
    """The default :data:`Decoder`: rank 0's value, decoded because the caller asked for it."""
    return (decode_strict(VALUE, parts[VALUE]) if VALUE in parts else None), {}


class WarmRanks(Protocol):
    """What a job asks of a warm pool (:class:`hvd_magics.job.pool.HorovodPool`) it runs on."""

    np: int
    engine: str
    ranks_per_task: int | None

    def cell(self, env: Mapping[str, str], sources: DataFrameSources | None = None) -> Backend:
        """The backend of the next cell, on the pool's ranks."""


@dataclass(frozen=True)
class LaunchRequest:
    """Everything one job needs to start, as :class:`HorovodRunner` settled it.

    ``size`` is an :class:`ElasticSize` for an elastic job, whose ``elastic_timeout`` and
    ``reset_limit`` then apply. ``preimport`` names the modules a rank imports while the launch
    goes on (the leading imports of ``source``, the cell's or the function's).
    """

    payload: JobPayload
    size: int | ElasticSize
    env: Mapping[str, str]
    start_timeout: float
    views: list[JobView]
    timeline: Path | None = None
    decode: Decoder = decode_value
    tracking: MlflowSettings | None = None
    source: str | None = None
    preimport: tuple[str, ...] = ()
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT_S
    reset_limit: int | None = None
    #: A warm pool to run on instead of new ranks.
    pool: WarmRanks | None = None
    #: Seconds after which the job is stopped, saying where each rank was (``None``: never).
    timeout: float | None = None
    #: Seconds of silence after which a rank is shown as stalled, with where it is.
    stall_after: float = STALL_AFTER_S
    #: Filled in as the job starts, for another thread (a background job's handle).
    live: LiveJob | None = None
    #: On a cluster, how long to wait for executors to register (longer for a restart, while
    #: the cluster replaces the executor it lost).
    slot_wait_s: float = SLOT_WAIT_S
    #: A job with restarts: which attempt this is (0 first), why each earlier one ended, and
    #: the MLflow run they recorded (every attempt goes on in the same run).
    attempt: int = 0
    earlier_attempts: tuple[str, ...] = ()
    mlflow_run_id: str | None = None
    #: Rank processes per Spark task (``None``: one per GPU the session gives a task, else one).
    ranks_per_task: int | None = None

    @property
    def elastic(self) -> ElasticSize | None:
        return self.size if isinstance(self.size, ElasticSize) else None

    @property
    def np(self) -> int:
        """The number of ranks (an elastic job's maximum); negative on the driver."""
        return self.size.max_np if isinstance(self.size, ElasticSize) else self.size

    def rank_env(self) -> dict[str, str]:
        """The ranks' environment: the user's, plus what to import early unless the user said."""
        env = dict(self.env)
        if self.preimport and ENV_PREIMPORT not in env:
            env[ENV_PREIMPORT] = ",".join(self.preimport)
        return env
