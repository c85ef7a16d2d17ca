"""What one job needs to start, settled by :class:`hvd_magics.job.runner.HorovodRunner`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from collections.abc import Callable, Mapping

from hvd_magics.job.job_state import JobView
from hvd_magics.job.live_job import LiveJob
from hvd_magics.job.readings.kept_steps import KeptSteps
from hvd_magics.job.records.mlflow_run import MlflowSettings
from hvd_magics.launch.backend import Backend
from hvd_magics.launch.dataframe_input import DataFrameSources
from hvd_magics.launch.encryption import IGNORE_SSL
from hvd_magics.launch.payload import JobPayload
from hvd_magics.launch.spark_slots import SLOT_WAIT_S
from hvd_magics.options import ElasticSize, JobOptions
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
    #: The folder that holds its jobs' checkpoint folders (``None``: the temporary folder).
    checkpoint_dir: str | None

    def cell(self, env: Mapping[str, str], sources: DataFrameSources | None = None) -> Backend:
        """The backend of the next cell, on the pool's ranks."""


@dataclass(frozen=True)
class LaunchRequest:
    """Everything one job needs to start: its options as checked once (:class:`JobOptions`),
    and what this run of it adds.

    ``env`` is the ranks' environment for this attempt (the options' :meth:`JobOptions.rank_env`
    and what a restart adds); ``preimport`` names the modules a rank imports while the launch
    goes on (the leading imports of ``source``, the cell's or the function's).
    """

    payload: JobPayload
    options: JobOptions
    env: Mapping[str, str]
    views: list[JobView]
    decode: Decoder = decode_value
    tracking: MlflowSettings | None = None
    source: str | None = None
    preimport: tuple[str, ...] = ()
    #: A warm pool to run on instead of new ranks.
    pool: WarmRanks | None = None
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
    #: The steps the hosts keep in memory, across the job's attempts (the controller's).
    kept: KeptSteps | None = None
    #: The setting that allows the job on Spark tasks of a session that asks for TLS
    #: (:mod:`hvd_magics.launch.encryption`).
    ignore_ssl: str = IGNORE_SSL

    @property
    def size(self) -> int | ElasticSize:
        return self.options.size

    @property
    def elastic(self) -> ElasticSize | None:
        return self.options.elastic

    @property
    def np(self) -> int:
        """The number of ranks (an elastic job's maximum); negative on the driver."""
        return self.options.np

    @property
    def start_timeout(self) -> float:
        return self.options.start_timeout

    def rank_env(self) -> dict[str, str]:
        """The ranks' environment: this attempt's, plus what to import early unless the user
        said."""
        env = dict(self.env)
        if self.preimport and ENV_PREIMPORT not in env:
            env[ENV_PREIMPORT] = ",".join(self.preimport)
        return env
