"""HorovodRunner: run a function as a Horovod job, on Spark (``np > 0``) or on the driver
(``np < 0``).

The runner settles the job's options and its request; the job's life is
:mod:`hvd_magics.job.job_life`, its watch :mod:`hvd_magics.job.watch`, its verdicts
:mod:`hvd_magics.job.verdicts`.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any
from collections.abc import Callable, Mapping

from hvd_magics.job.background import BackgroundJob
from hvd_magics.job.controller import run_job
from hvd_magics.job.job_state import JobView
from hvd_magics.job.launch_request import Decoder, LaunchRequest, WarmRanks, decode_value
from hvd_magics.job.live_job import LiveJob
from hvd_magics.job.records.mlflow_run import requested
from hvd_magics.job.restarts import ResumeFix, checkpoint_folder, job_name, pool_resume_fix
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.session import SESSION
from hvd_magics.job.views.default_views import default_views
from hvd_magics.launch.encryption import IGNORE_SSL
from hvd_magics.launch.payload import JobPayload, leading_imports, serialize_job
from hvd_magics.option_table import RUNNER_OPTIONS, declared
from hvd_magics.options import (DEFAULT_ELASTIC_TIMEOUT_S, DEFAULT_START_TIMEOUT_S,
                                STALL_AFTER_S, VERBOSITY_ALL, ElasticSize, JobOptions)
from hvd_magics.protocol import ENGINE_HOROVOD

__all__ = [
    "Decoder",
    "HorovodRunner",
    "LaunchRequest",
    "decode_value",
    "default_views",
    "last_run",
    "source_of",
]


def last_run() -> RunRecord | None:
    """The record of the most recent job in this process (also failed or interrupted ones)."""
    return SESSION.last_run


class HorovodRunner:
    """Run a Horovod training function on Spark, compatible with Databricks'
    ``sparkdl.HorovodRunner``.

    Parameters
    ----------
    np : int, str or (int, int)
        ``np > 0``: ``np`` ranks as tasks of one Spark barrier stage on the active SparkSession
        (an embedded local one is started when there is none). ``np < 0``: ``-np`` ranks as
        processes on the driver, no Spark job. ``np = 0`` is an error.
        ``np=(MIN, MAX)`` or ``np="MIN:MAX"``: an elastic job. It starts once ``MIN`` ranks can
        run, uses up to ``MAX`` (one Spark task each), goes on when ranks are lost as long as
        ``MIN`` remain, and adds ranks when task slots free up. The function uses Horovod's
        elastic API (``hvd.elastic.run``, a ``State`` and ``state.commit()``), as for
        ``horovodrun --min-np``.
    driver_log_verbosity : {"all", "log_callback_only"}
        ``"all"`` shows every rank's output on the driver; ``"log_callback_only"`` shows only
        what ranks send with :func:`hvd_magics.log_to_driver`. The full log is always kept.
    start_timeout : float
        Seconds to wait for every rank process to start before giving up.
    env : mapping, optional
        Extra environment variables for the rank processes.
    timeline : str or path, optional
        Record Horovod Timeline into this file on the driver (whichever host rank 0 runs on).
        The record's ``timeline_path`` names it; ``hvd_magics.job.records.timeline.summarize``
        reads it.
        (A constructor keyword, so that ``run(main, **kwargs)`` passes every keyword to ``main``.)
    timeline_mark_cycles : bool
        Mark Horovod's cycles in the timeline (``HOROVOD_TIMELINE_MARK_CYCLES``).
    mlflow : bool or str, optional
        Record each run in one MLflow run, from the driver: ``True`` in the current experiment, a
        string names the experiment, ``False`` never. By default (``None``) a run is recorded
        when the notebook has an active MLflow run (as a nested run) or ``%hvd_mlflow on`` was
        used. Needs ``pip install 'hvd_magics[mlflow]'``.
    elastic_timeout : float
        An elastic job with fewer than ``MIN`` ranks for this many seconds stops with an error
        (Horovod's default, 600).
    reset_limit : int, optional
        An elastic job whose ranks would re-form more often than this stops with an error
        (default: no limit).
    pool : HorovodPool, optional
        Run on the warm ranks of this pool (:class:`hvd_magics.HorovodPool`) instead of new ones;
        ``np`` must be the pool's. ``env`` is then set on the ranks for each run.
    timeout : float, optional
        Stop the job after this many seconds; the error says where each rank was
        (``%%horovod --timeout``). Default: no limit.
    stall_after : float
        A rank with no output or progress for this many seconds is shown as stalled, with the
        line of your code it is in (``%%horovod --stall-after``; default 60). Horovod's own stall
        check (``HOROVOD_STALL_CHECK_TIME_SECONDS``) is set to the same unless ``env`` sets it.
    engine : {"horovod", "torch", "tf"}, optional
        What the ranks run on (``%%horovod --engine``): ``"horovod"`` (``hvd.init()``),
        ``"torch"`` (``torch.distributed.init_process_group()`` reads the environment torchrun
        sets: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``LOCAL_WORLD_SIZE``) or ``"tf"`` (``tf.distribute.MultiWorkerMirroredStrategy()`` reads
        ``TF_CONFIG``). Default: the pool's engine, else ``"horovod"``. Elastic jobs and
        ``timeline`` are Horovod's.
    restarts : int
        When a rank or its executor is lost (killed, or its peers' collective library reports
        the loss), start the job again, up to this many times (``%%horovod --restarts``). A
        rank's own exception is not retried. Each attempt resumes from the job's latest
        checkpoint when the function uses :mod:`hvd_magics.checkpoint`.
    checkpoint_dir : str or path, optional
        The job's checkpoint folder (:func:`hvd_magics.checkpoint.directory`). Default: one per
        function or cell, under the driver's temporary folder; on a cluster, give a folder
        every executor shares.
    fresh : bool
        Remove the job's checkpoints first, so that it starts over (``%%horovod --fresh``).
    keep_steps : bool
        Keep every training step in the hosts' memory where Lightning's ``Trainer`` trains,
        with no line added (``%%horovod --keep-steps``): a rank killed without notice costs at
        most one step, and ``restarts`` resume there. A loop of your own calls
        :func:`hvd_magics.checkpoint.keep`.
    ranks_per_task : int, optional
        Rank processes in each Spark task (``%%horovod --ranks-per-task``): ``np=16,
        ranks_per_task=8`` runs 2 tasks of 8 ranks, numbered node by node, each task holding
        8 times ``spark.task.cpus`` (and its GPUs, a rank each). Default: as many as the
        session gives each task GPUs (``spark.task.resource.gpu.amount`` above 1), else one.
        Every engine is told the ranks' true local rank and size.

    Raises
    ------
    ValueError
        For a wrong value, naming the keyword and the fix: ``np = 0``, a number given as text
        (``restarts="1"``), a switch given as anything but ``True`` or ``False``
        (``fresh="no"``), an ``env`` that is not a dict of texts, an empty ``checkpoint_dir``.
    MlflowMissing
        For ``mlflow`` asked without the mlflow package (an ``ImportError`` that says how to
        install it).

    Examples
    --------
    >>> hr = HorovodRunner(np=2)
    >>> hr.run(train, learning_rate=0.1)  # doctest: +SKIP
    """

    #: The Spark setting that allows a job on Spark tasks of a session with
    #: ``spark.ssl.enabled=true`` (pyspark's; the DeepSpeed drop-in's runner sets its own).
    ignore_ssl: str = IGNORE_SSL

    def __init__(self, np: int, driver_log_verbosity: str = VERBOSITY_ALL,
                 start_timeout: float = DEFAULT_START_TIMEOUT_S,
                 env: Mapping[str, str] | None = None,
                 timeline: str | os.PathLike | None = None,
                 timeline_mark_cycles: bool = False, mlflow: bool | str | None = None,
                 elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT_S,
                 reset_limit: int | None = None, pool: WarmRanks | None = None,
                 timeout: float | None = None, stall_after: float = STALL_AFTER_S,
                 engine: str | None = None, restarts: int = 0,
                 checkpoint_dir: str | os.PathLike | None = None, fresh: bool = False,
                 keep_steps: bool = False, ranks_per_task: int | None = None) -> None:
        # every keyword but pool is a declared option (hvd_magics.option_table), checked once
        self.options = JobOptions.checked(
            declared(locals(), RUNNER_OPTIONS),
            default_engine=getattr(pool, "engine", ENGINE_HOROVOD), on_pool=pool is not None)
        if pool is not None:
            _check_pool(self.options, pool, np, engine, ranks_per_task)
        self.pool = pool
        #: How a preempted job without restarts tells the user to resume (``None``: a job's
        #: own way; the HorovodEstimator says its modelDir and setRestarts).
        self.resume_fix: ResumeFix | None = None
        if mlflow:
            requested(mlflow, None)  # says how to install MLflow now, not at the first run

    @property
    def num_processor(self) -> int:
        """The number of ranks, negative on the driver (sparkdl's attribute); an elastic
        job's most."""
        return self.options.np

    @property
    def elastic(self) -> ElasticSize | None:
        """``MIN:MAX`` of an elastic job, else ``None``."""
        return self.options.elastic

    @property
    def engine(self) -> str:
        return self.options.engine

    @property
    def env(self) -> dict[str, str]:
        """The ranks' environment: the user's and what the job sets there."""
        return self.options.rank_env()

    @property
    def driver_log_verbosity(self) -> str:
        return self.options.verbosity

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return what it returned on rank 0.

        A Spark DataFrame among ``kwargs`` (or among the globals ``main`` uses) arrives on each
        rank as its :class:`hvd_magics.rank.api.shard.Shard`: the rows that rank trains on, read
        from a local file its Spark task wrote. The driver never collects the DataFrame.

        Raises
        ------
        PayloadError
            When ``main`` or an argument cannot be pickled, or a DataFrame has a column its
            shard cannot give as arrays (before anything starts).
        NotEnoughSlotsError
            When the cluster has fewer free task slots than ``np``.
        HorovodJobError
            When a rank raised or died; the error shows each failed rank's traceback.
        StartTimeoutError
            When ranks did not start within ``start_timeout``.
        """
        payload = serialize_job(main, kwargs)
        return self.run_payload(payload, source=source_of(main),
                                job_name=job_name(source_of(main), kwargs)).value

    def run_payload(self, payload: JobPayload | bytes, views: list[JobView] | None = None,
                    decode: Decoder = decode_value, source: str | None = None,
                    preimport: tuple[str, ...] | None = None,
                    job_name: str | None = None) -> RunRecord:
        """Run an already serialised job; return its :class:`RunRecord` (used by the magics).

        ``decode`` turns what rank 0 sent back into the record's ``value`` and ``returned``;
        ``source`` (the cell's or the function's) goes to MLflow when the run is tracked;
        ``preimport`` (default: the leading imports of ``source``) is what ranks import early;
        ``job_name`` (default: ``source``) names the job's checkpoint folder.
        """
        return self._launch(self._request(payload, views, decode, source, preimport),
                            job_name)

    def _launch(self, request: LaunchRequest, name: str | None = None) -> RunRecord:
        """One job, started again after a loss up to ``restarts`` times (never on a pool:
        its cell runs once, in its own checkpoint folder as a cold job's)."""
        options, pool = self.options, request.pool
        folder = checkpoint_folder(name or request.source, options.checkpoint_dir,
                                   pool.checkpoint_dir if pool is not None else None)
        fix = self.resume_fix or (pool_resume_fix(folder) if request.pool is not None else None)
        return run_job(request, options.restarts, folder, options.fresh, fix)

    def start(self, main: Callable[..., Any], **kwargs: Any) -> BackgroundJob:
        """Start ``main(**kwargs)`` on every rank in the background; return its handle at once.

        The notebook stays free while it runs; ``job.wait()`` gives rank 0's value (or raises
        the job's error), ``job.stop()`` ends it, ``job.stacks()`` shows where each rank is.
        Raises at once what refuses the job before its ranks start (``PayloadError``,
        ``NotEnoughSlotsError`` when this notebook's pools and background jobs hold the slots).
        """
        payload = serialize_job(main, kwargs)
        return self.start_payload(payload, source=source_of(main),
                                  job_name=job_name(source_of(main), kwargs))

    def start_payload(self, payload: JobPayload | bytes, views: list[JobView] | None = None,
                      decode: Decoder = decode_value, source: str | None = None,
                      preimport: tuple[str, ...] | None = None,
                      on_success: Callable[[RunRecord], None] | None = None,
                      job_name: str | None = None) -> BackgroundJob:
        """:meth:`run_payload` in the background (used by ``%%horovod --background``);
        ``on_success`` is called with the record when the job succeeded."""
        if views is None:
            views = default_views(self.driver_log_verbosity, background=True)
        request = self._request(payload, views, decode, source, preimport)
        spark = 0 if self.pool is not None or self.num_processor < 0 else self.num_processor

        def run(live: LiveJob) -> RunRecord:
            return self._launch(dataclasses.replace(request, live=live), job_name)

        return BackgroundJob(run, self.num_processor, spark, on_success)

    def _request(self, payload: JobPayload | bytes, views: list[JobView] | None,
                 decode: Decoder, source: str | None,
                 preimport: tuple[str, ...] | None) -> LaunchRequest:
        if preimport is None:
            preimport = tuple(leading_imports(source)) if source else ()
        return LaunchRequest(
            payload if isinstance(payload, JobPayload) else JobPayload(payload), self.options,
            self.options.rank_env(),
            default_views(self.options.verbosity) if views is None else views, decode,
            requested(self.options.mlflow, SESSION.mlflow), source, preimport, self.pool,
            ignore_ssl=self.ignore_ssl)


def _check_pool(options: JobOptions, pool: WarmRanks, np: Any, engine: str | None,
                ranks_per_task: Any) -> None:
    """Refuse what differs from the warm pool's ranks a job would run on."""
    if options.ranks_per_task not in (None, pool.ranks_per_task):
        raise ValueError(f"ranks_per_task={ranks_per_task} is not the warm pool's "
                         f"({pool.ranks_per_task}). Fix: leave it out to run on the pool.")
    if options.engine != pool.engine:
        raise ValueError(f"engine={engine!r} is not the warm pool's engine "
                         f"({pool.engine!r}). Fix: leave engine out to run on the pool, or "
                         "leave the pool out for a cold job on another engine.")
    if options.size != pool.np:
        raise ValueError(f"np={np} is not the warm pool's np={pool.np}. Fix: use np={pool.np} "
                         "on the pool, or leave the pool out for a cold job.")


def source_of(main: Callable) -> str | None:
    try:
        return inspect.getsource(main)
    except (OSError, TypeError):
        return None
