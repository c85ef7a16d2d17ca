"""HorovodRunner: run a function as a Horovod job, on Spark (``np > 0``) or on the driver (``np < 0``)."""
from __future__ import annotations

import dataclasses
import inspect
import os
import queue
import sys
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping

from hvd_magics.launch.driver_backend import DriverBackend
from hvd_magics.errors import (DataRefused, HorovodJobError, JobInterrupted, JobTimeoutError,
                               PayloadError, RankFailure, StartTimeoutError)
from hvd_magics.job.job_state import (LOST, PREEMPTED, STALL_AFTER_S, STALL_REQUEST, WAITING,
                                      JobState, JobView)
from hvd_magics.job.background import BackgroundJob
from hvd_magics.job.failure_hints import hint_for
from hvd_magics.job.link_probe import COMM_BOUND_SHARE, LinkProbe
from hvd_magics.job.link_probe import verdict as link_verdict
from hvd_magics.job.preemption import CHECK_EVERY_S, notice_text
from hvd_magics.job.live_job import STOP_WAIT_S, LiveJob
from hvd_magics.job.stacks import (DDP_ALLREDUCE, STACKS_WAIT_S, UNEVEN_DDP_FIX, UNEVEN_FIX,
                                   JobStacks, collective_waited)
from hvd_magics.job.stacks import where as stack_where
from hvd_magics.job.mlflow_run import MlflowSettings, MlflowTracker, requested
from hvd_magics.launch.dataframe_input import check_columns, common_session
from hvd_magics.task.engines import engine_of
from hvd_magics.launch.payload import JobPayload, leading_imports, serialize_job
from hvd_magics.protocol import (ENGINE_HOROVOD, ENV_ENGINE, ENV_EVERY_RESULT, ENV_HOST_SILENT,
                                 ENV_NOTICE_SAVE_WAIT, ENV_PREIMPORT, ENV_STALL_CHECK,
                                 ENV_TIMELINE_MARK_CYCLES, ENV_WANT_TIMELINE)
from hvd_magics.notices import say
from hvd_magics.rank_names import rank_named, ranks_named
from hvd_magics.result_codec import VALUE, ResultDecodeError, decode_strict
from hvd_magics.job.restarts import (ResumeFix, checkpoint_folder, job_name,
                                     launch_with_restarts, pool_resume_fix, preempted)
from hvd_magics.job.run_logs import prune_old_runs, runs_dir
from hvd_magics.job.run_record import RunRecord
from hvd_magics.job.session import SESSION
from hvd_magics.launch.backend import Backend
from hvd_magics.launch.local_ranks import reap_local_ranks
from hvd_magics.launch import interrupt_guard
from hvd_magics.launch.spark_backend import SparkBackend
from hvd_magics.launch.spark_slots import SLOT_WAIT_S
from hvd_magics.launch.spark_session import active_session, is_connect, start_local_session
from hvd_magics.options import (DEFAULT_ELASTIC_TIMEOUT_S, DEFAULT_START_TIMEOUT_S,
                                    VERBOSITY_ALL, ElasticSize, positive_seconds,
                                    horovod_only, validate_elastic_timeout, validate_engine,
                                    validate_ranks_per_task, validate_reset_limit,
                                    validate_restarts, validate_size,
                                    validate_start_timeout, validate_verbosity)
from hvd_magics.job.text_view import TextView
from hvd_magics.job.widgets_view import WidgetView, widgets_available

#: After the first rank fails, how long to gather the other ranks' errors before stopping them.
FAILURE_GRACE_S = 1.0
#: How long rank 0 may take to write the checkpoint of a preemption notice once the other ranks
#: ended on it (their part done), unless ``HVD_MAGICS_NOTICE_SAVE_WAIT_S`` says otherwise: a
#: large model's checkpoint takes minutes, and a spot instance's notice gives 30 s to 2 min.
NOTICE_SAVE_WAIT_S = 300.0
#: A rank's errors that mean the executors' Python lacks a module.
IMPORT_ERRORS = ("ModuleNotFoundError", "ImportError")
#: The same at an interrupt, which should stop the job at once.
INTERRUPT_STACKS_WAIT_S = 1.0
#: Seconds a host's rank supervisors may be silent (they beat every second) before the host is
#: taken for lost (``HVD_MAGICS_HOST_SILENT_S``): Spark itself waits 60 s, Gloo 30 s.
HOST_SILENT_S = 10.0
#: How often the cell's line says the executors still fetch and unpack the environment.
UNPACKING_SHOWN_EVERY_S = 5.0
#: After a rank finished the job's code, how long a peer may wait in a collective before its
#: stacks are taken; one found in the same collective twice this far apart waits for a
#: collective the finished rank will never enter (the ranks made different calls).
LEFT_BEHIND_S = 2.0
#: After the Spark job ended, how long the ranks' event connections may take to deliver what is
#: still on its way (a large result) before the job is judged on what arrived.
DRAIN_WAIT_S = 120.0

#: Said when ranks of an elastic job failed because they lost a peer: what survives a loss.
ELASTIC_RUN_HINT = (
    ". A rank that loses a peer goes on only inside a function decorated with "
    "@hvd.elastic.run (taking a hvd.elastic State that the loop commits with state.commit()); "
    "outside one, Horovod shuts down on every rank. Fix: put the training loop in such a "
    "function (Horovod's elastic examples show the pattern)")

#: ``decode(parts) -> (value, returned)``: what a job's record holds as its ``value`` and its
#: ``returned`` variables, from rank 0's encoded parts (:mod:`hvd_magics.result_codec`).
Decoder = Callable[[dict], "tuple[Any, dict[str, Any]]"]


def decode_value(parts: dict) -> tuple[Any, dict[str, Any]]:
    """The default :data:`Decoder`: rank 0's value, decoded because the caller asked for it."""
    return (decode_strict(VALUE, parts[VALUE]) if VALUE in parts else None), {}


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
    #: A warm pool (:class:`hvd_magics.job.pool.HorovodPool`) to run on instead of new ranks.
    pool: Any = None
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

def last_run() -> RunRecord | None:
    """The record of the most recent job in this process (also failed or interrupted ones)."""
    return SESSION.last_run


def default_views(verbosity: str = VERBOSITY_ALL, show_output: bool = True,
                  background: bool = False) -> list[JobView]:
    """Widgets in a Jupyter kernel with ipywidgets, plus the ranks' output as text; a
    background job shows widgets only when it can (text printed from its thread would land in
    whichever cell runs then)."""
    views: list[JobView] = []
    widgets = widgets_available()
    text = show_output and not (background and widgets)
    if widgets:  # the ranks' output is shown once: as text, or else in the dashboard
        views.append(WidgetView(display_now=background, show_log=not text))
    if text:
        views.append(TextView(verbosity, epoch_lines=not widgets))
    return views


class HorovodRunner:
    """Run a Horovod training function on Spark, compatible with Databricks' ``sparkdl.HorovodRunner``.

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
        The record's ``timeline_path`` names it; ``hvd_magics.job.timeline.summarize`` reads it.
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
    ranks_per_task : int, optional
        Rank processes in each Spark task (``%%horovod --ranks-per-task``): ``np=16,
        ranks_per_task=8`` runs 2 tasks of 8 ranks, numbered node by node, each task holding
        8 times ``spark.task.cpus`` (and its GPUs, a rank each). Default: as many as the
        session gives each task GPUs (``spark.task.resource.gpu.amount`` above 1), else one.
        Every engine is told the ranks' true local rank and size.

    Raises
    ------
    ValueError
        For ``np = 0``, a non-integer ``np`` or an unknown verbosity.
    MlflowMissing
        For ``mlflow`` asked without the mlflow package (an ``ImportError`` that says how to
        install it).

    Examples
    --------
    >>> hr = HorovodRunner(np=2)
    >>> hr.run(train, learning_rate=0.1)  # doctest: +SKIP
    """

    def __init__(self, np: int, driver_log_verbosity: str = VERBOSITY_ALL,
                 start_timeout: float = DEFAULT_START_TIMEOUT_S,
                 env: Mapping[str, str] | None = None,
                 timeline: str | os.PathLike | None = None,
                 timeline_mark_cycles: bool = False, mlflow: bool | str | None = None,
                 elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT_S,
                 reset_limit: int | None = None, pool: Any = None,
                 timeout: float | None = None, stall_after: float = STALL_AFTER_S,
                 engine: str | None = None, restarts: int = 0,
                 checkpoint_dir: str | os.PathLike | None = None, fresh: bool = False,
                 ranks_per_task: int | None = None) -> None:
        size = validate_size(np)
        self.ranks_per_task = validate_ranks_per_task(ranks_per_task, size)
        if pool is not None and self.ranks_per_task not in (None, pool.ranks_per_task):
            raise ValueError(f"ranks_per_task={ranks_per_task} is not the warm pool's "
                             f"({pool.ranks_per_task}). Fix: leave it out to run on the pool.")
        self.restarts = validate_restarts(restarts, elastic=isinstance(size, ElasticSize),
                                          pool=pool is not None)
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.fresh = bool(fresh)
        #: How a preempted job without restarts tells the user to resume (``None``: a job's
        #: own way; the HorovodEstimator says its modelDir and setRestarts).
        self.resume_fix: ResumeFix | None = None
        pool_engine = getattr(pool, "engine", ENGINE_HOROVOD)
        self.engine = pool_engine if engine is None else validate_engine(engine)
        if pool is not None and self.engine != pool_engine:
            raise ValueError(f"engine={engine!r} is not the warm pool's engine "
                             f"({pool_engine!r}). Fix: leave engine out to run on the pool, or "
                             "leave the pool out for a cold job on another engine.")
        if isinstance(size, ElasticSize):
            horovod_only(f"an elastic job (np={np})", self.engine,
                         "Fix: give a fixed np, or use engine='horovod' with hvd.elastic "
                         "(torch's elastic agent restarts every worker at each change, which "
                         "a notebook's job cannot follow).")
        if timeline is not None:
            horovod_only("the Horovod Timeline (timeline=, %hvd_timeline)", self.engine,
                         "Fix: record a trace with torch.profiler or tf.profiler in the job; "
                         "epoch timing, charts and %hvd_stacks work on every engine.")
        self.timeout = None if timeout is None else positive_seconds(timeout,
                                                                     "timeout (--timeout)")
        self.stall_after = positive_seconds(stall_after, "stall_after (--stall-after)")
        if pool is not None and size != pool.np:
            raise ValueError(f"np={np} is not the warm pool's np={pool.np}. Fix: use np={pool.np} "
                             "on the pool, or leave the pool out for a cold job.")
        self.pool = pool
        #: The number of ranks (sparkdl's attribute); an elastic job's maximum.
        self.num_processor = size.max_np if isinstance(size, ElasticSize) else size
        #: ``MIN:MAX`` of an elastic job, else ``None``.
        self.elastic = size if isinstance(size, ElasticSize) else None
        self.elastic_timeout = validate_elastic_timeout(elastic_timeout)
        self.reset_limit = validate_reset_limit(reset_limit)
        self.driver_log_verbosity = validate_verbosity(driver_log_verbosity)
        self.start_timeout = validate_start_timeout(start_timeout)
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        if self.engine == ENGINE_HOROVOD:
            self.env.setdefault(ENV_STALL_CHECK, str(max(1, round(self.stall_after))))
        self.env[ENV_ENGINE] = self.engine
        self.timeline = Path(timeline) if timeline is not None else None
        self.mlflow = mlflow
        if mlflow:
            requested(mlflow, None)  # says how to install MLflow now, not at the first run
        if self.timeline is not None:
            self.env[ENV_WANT_TIMELINE] = "1"
            if timeline_mark_cycles:
                self.env[ENV_TIMELINE_MARK_CYCLES] = "1"

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return what it returned on rank 0.

        A Spark DataFrame among ``kwargs`` (or among the globals ``main`` uses) arrives on each
        rank as its :class:`hvd_magics.rank.shard.Shard`: the rows that rank trains on, read
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
        folder = checkpoint_folder(name or request.source, self.checkpoint_dir)
        fix = self.resume_fix or (pool_resume_fix(folder) if request.pool is not None else None)
        return launch_with_restarts(request, launch, self.restarts, folder, self.fresh, fix)

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
        session = active_session() if spark else None
        if session is not None and not is_connect(session):  # from the main thread, now
            interrupt_guard.install(session.sparkContext)

        def run(live: LiveJob) -> RunRecord:
            return self._launch(dataclasses.replace(request, live=live), job_name)

        return BackgroundJob(run, self.num_processor, spark, on_success)

    def _request(self, payload: JobPayload | bytes, views: list[JobView] | None,
                 decode: Decoder, source: str | None,
                 preimport: tuple[str, ...] | None) -> LaunchRequest:
        if preimport is None:
            preimport = tuple(leading_imports(source)) if source else ()
        return LaunchRequest(
            payload if isinstance(payload, JobPayload) else JobPayload(payload),
            self.elastic or self.num_processor, self.env, self.start_timeout,
            default_views(self.driver_log_verbosity) if views is None else views,
            self.timeline, decode, requested(self.mlflow, SESSION.mlflow), source, preimport,
            self.elastic_timeout, self.reset_limit, self.pool, self.timeout, self.stall_after,
            ranks_per_task=self.ranks_per_task)


def _make_backend(request: LaunchRequest) -> Backend:
    np, env, sources = request.size, request.rank_env(), request.payload.sources
    if request.pool is not None:
        return request.pool.cell(request.env, sources)
    if isinstance(np, ElasticSize):
        if sources:
            raise PayloadError(
                f"the job reads the DataFrame {sources.sources[0].name!r}, but an elastic job "
                f"(np={np}) cannot reshard a DataFrame when its ranks change. Fix: run it with a "
                f"fixed np={np.max_np}, or have each rank read its part of the data itself (for "
                "PyTorch, Horovod's hvd.elastic.ElasticSampler reshards at every reset).")
        from hvd_magics.launch.elastic_backend import ElasticSparkBackend

        spark = active_session() or start_local_session(np.max_np)
        return ElasticSparkBackend(spark, np, env, request.start_timeout,
                                   request.elastic_timeout, request.reset_limit,
                                   SESSION.environment)
    if sources:
        if np < 0:
            raise PayloadError(
                f"the job reads the DataFrame {sources.sources[0].name!r}, whose rows reach the "
                "ranks through Spark tasks, but np<0 runs the ranks on the driver without "
                f"Spark. Fix: use np={-np}.")
        for source in sources:
            check_columns(source)
        return SparkBackend(common_session(sources), np, env, sources,
                            slot_wait_s=request.slot_wait_s,
                            held_slots=SESSION.held_slots(request.live),
                            background=request.live is not None,
                            environment=SESSION.environment,
                            ranks_per_task=request.ranks_per_task)
    if np < 0:
        return DriverBackend(-np, env)
    spark = active_session() or start_local_session(np)
    return SparkBackend(spark, np, env, slot_wait_s=request.slot_wait_s,
                        held_slots=SESSION.held_slots(request.live),
                        background=request.live is not None,
                        environment=SESSION.environment, ranks_per_task=request.ranks_per_task,
                        gone_wait_s=request.start_timeout)


def source_of(main: Callable) -> str | None:
    try:
        return inspect.getsource(main)
    except (OSError, TypeError):
        return None


def _tracker(request: LaunchRequest, job_id: str, where: str,
             engine: str) -> MlflowTracker | None:
    if request.tracking is None:
        return None
    try:
        return MlflowTracker(request.tracking, job_id, request.np, where, request.source, engine,
                             attempt=request.attempt, continue_run=request.mlflow_run_id,
                             earlier_attempts=request.earlier_attempts)
    except Exception as exc:  # noqa: BLE001 - tracking never stops a job
        warnings.warn(f"hvd_magics: MLflow tracking could not start ({type(exc).__name__}: "
                      f"{exc}); the job goes on without it.", stacklevel=3)
        return None


def launch(request: LaunchRequest) -> RunRecord:
    """Run one job to its end and return its record; raise when it failed.

    Whatever happens, the views are ended and the log is closed before this returns or raises.
    """
    elastic, size = request.elastic, request.np
    job_id = uuid.uuid4().hex[:12]
    backend = _make_backend(request)
    prune_old_runs()
    log_path = runs_dir() / job_id / "ranks.log"
    engine = engine_of(request.env)
    tracker = _tracker(request, job_id, backend.where, engine)
    job = JobState(abs(size), log_path, request.views + ([tracker] if tracker else []),
                   backend.where, elastic, timeline_dest=request.timeline,
                   stall_after=request.stall_after, engine=engine)
    job.earlier_attempts = request.earlier_attempts
    record = RunRecord(job_id=job_id, np=size, where=backend.where, log_path=str(log_path),
                       elastic=str(elastic) if elastic else None, engine=engine)
    SESSION.last_run = record
    events: queue.Queue = queue.Queue()
    if request.live is not None:
        request.live.job, request.live.backend, request.live.record = job, backend, record
    clean = False
    failure: BaseException | None = None
    try:
        backend.start(request.payload.blob, job_id, events)
        if request.live is not None:
            request.live.started.set()
        stop = request.live.stop if request.live is not None else None
        (_watch_elastic(job, backend, events, stop) if elastic else
         _watch(job, backend, events, request.start_timeout, request.timeout, stop))
        clean = True
        try:
            record.value, record.returned = request.decode(job.result_parts)
            if request.env.get(ENV_EVERY_RESULT) == "1":
                record.values = [request.decode(job.rank_parts.get(rank, {}))[0]
                                 for rank in range(job.size)]
        except ResultDecodeError as exc:
            raise HorovodJobError(str(exc), log_path=str(log_path)) from None
    except KeyboardInterrupt:
        record.status = "interrupted"
        record.error = "interrupted"
        failure = KeyboardInterrupt()
        try:
            where_they_were = _where_on_interrupt(job, backend, events)
        except KeyboardInterrupt:  # a second interrupt: stop without looking
            where_they_were = ""
    except BaseException as exc:  # noqa: BLE001 - recorded, then raised as it is
        # an attempt every rank ended on a preemption notice, on purpose, is not a failure
        notice = preempted(exc) if isinstance(exc, HorovodJobError) else None
        record.status = PREEMPTED if notice else "failed"
        # its error says the same (it said "2 of 2 ranks failed" of a preempted attempt)
        record.error = (f"preempted: {notice} (every rank stopped at the notice, on purpose)"
                        if notice else f"{type(exc).__name__}: {exc}")
        failure = exc
    finally:
        try:
            _wind_down(backend, job, events, clean)
        except KeyboardInterrupt:  # a second interrupt while the job is being stopped
            backend.stop()
            _reap_local_ranks(job, backend)
            record.status = record.error = "interrupted"
            raise JobInterrupted("stopped while the job was being wound down; its rank "
                                 "processes were killed. The log of every rank: "
                                 + str(log_path)) from None
        finally:
            _finish(record, job)
            if tracker is not None:
                tracker.finish(record)
    note = backend.restart_note
    if isinstance(failure, KeyboardInterrupt):
        if backend.keeps_ranks:
            what = (note or "the pool keeps its ranks and their variables.") + " "
            raise JobInterrupted(f"interrupted the cell on every rank of the warm pool; {what}"
                                 + where_they_were + "The log of every rank: "
                                 + str(log_path)) from None
        raise JobInterrupted(
            f"stopped {job.current_size} rank processes"
            + (f" and cancelled Spark job group hvd_magics-{job_id}" if size > 0 else "")
            + "; nothing is left running. " + where_they_were + "The log of every rank: "
            + str(log_path)) from None
    if failure is not None:
        note = note or (_diverged_note(job) if backend.keeps_ranks else "")
        if note and isinstance(failure, HorovodJobError):
            failure.add_summary(note)
        if isinstance(failure, HorovodJobError) and any(
                f.error in IMPORT_ERRORS for f in failure.failures):
            fix = backend.missing_module_fix().strip()
            if fix:
                failure.add_summary(fix)
        raise failure
    return record


def _diverged_note(job: JobState) -> str:
    """On a warm pool, when some ranks finished the cell and others did not: their variables
    now differ (each kept what its cell assigned before it ended)."""
    finished = job.finished_ranks()
    others = [r.rank for r in job.ranks if r.rank not in finished]
    if not finished or not others:
        return ""
    return (f"{ranks_named(finished, job.unit)} finished the cell and "
            f"{ranks_named(others, job.unit)} did not: the ranks' "
            "variables now differ (each kept what its cell assigned before it ended). Fix: run "
            "a cell that sets them again on every rank, or %hvd_pool restart.")


def _wind_down(backend: Backend, job: JobState, events: queue.Queue, clean: bool) -> None:
    """Stop the job unless it ended by itself, wait for the Spark job, take what arrived, and
    make sure no rank process is left on this host."""
    if not clean:
        backend.stop()
    ended = backend.join(STOP_WAIT_S)
    if not ended:
        backend.stop()
    _drain(job, events)
    if not clean:
        _reap_local_ranks(job, backend)


def _drain(job: JobState, events: queue.Queue) -> None:
    while True:
        try:
            job.handle(events.get_nowait())
        except queue.Empty:
            return


def _follow(job: JobState, events: queue.Queue) -> float:
    """Apply what arrived within a tenth of a second, let the views refresh; return the time."""
    try:
        job.handle(events.get(timeout=0.1))
        _drain(job, events)
    except queue.Empty:
        pass
    job.tick()
    return time.monotonic()


def collect_stacks(job: JobState, backend: Backend, events: queue.Queue,
                   wait: float = STACKS_WAIT_S) -> JobStacks:
    """Ask every running rank where it is; wait up to ``wait`` seconds for the answers (the
    job's other events are applied meanwhile)."""
    began = time.monotonic()
    # every rank that has not exited is waited for: following the job's events meanwhile also
    # records the pids of ranks that just started (an interrupt's clean-up needs them)
    waiting = set(job.running_ranks()) | set(job.starting_ranks())
    if not waiting:
        return JobStacks(starting=job.starting_ranks())
    request = job.request_stacks(backend)
    while time.monotonic() - began < wait and not waiting <= set(job.stacks[request]):
        _follow(job, events)
    answers = job.stacks.pop(request)
    unanswered, starting = waiting - set(answers), set(job.starting_ranks())
    return JobStacks(dict(answers), sorted(unanswered - starting), time.monotonic() - began,
                     sorted(unanswered & starting), job.splits.now(job.unit))


def _where_on_interrupt(job: JobState, backend: Backend, events: queue.Queue) -> str:
    """``" Where each rank was:"`` and a line per rank, or ``""`` when none answered (the ranks
    had gone already: on classic Spark, pyspark cancels the job at the interrupt)."""
    stacks = collect_stacks(job, backend, events, INTERRUPT_STACKS_WAIT_S)
    if not stacks.ranks:
        return ""
    return f"Where each {job.unit} was:\n" + stacks.summary(job.unit) + "\n"


def left_behind(job: JobState, backend: Backend, events: queue.Queue, now: float,
                seen: dict[str, Any]) -> str | None:
    """Why the job cannot end, when ranks finished its code while a peer waits, alone, in a
    collective they will never enter (found twice :data:`LEFT_BEHIND_S` apart); else ``None``.

    Horovod's own check (our patch) says so within seconds on the Horovod engine; Gloo under
    ``torch.distributed`` and tf.distribute's collectives wait for the missing peer forever.
    """
    noticed = job.ended_on_notice()
    finished = sorted({*job.finished_ranks(), *noticed})
    running = [r for r in job.running_ranks() if r not in finished]
    if not finished or not running:
        seen.clear()
        return None
    if now - seen.setdefault("asked", now) < LEFT_BEHIND_S:
        return None
    seen["asked"] = now
    stacks = collect_stacks(job, backend, events)
    waits = {rank: collective_waited(stacks.ranks[rank]) for rank in running
             if rank in stacks.ranks}
    waiting = {rank: (stack_where(stacks.ranks[rank].get("threads", [])),
                      (stacks.ranks[rank].get("ddp") or {}).get("steps"))
               for rank, engine in waits.items() if engine}
    stuck = {rank: at for rank, at in waiting.items() if seen.get("waiting", {}).get(rank) == at}
    seen["waiting"] = waiting
    if not stuck:
        return None
    engine = waits[min(stuck)]
    at = "; ".join(f"{rank_named(rank, job.unit)} in {where}"
                   for rank, (where, _steps) in sorted(stuck.items()))
    if noticed:
        return _stuck_in_the_save(job, noticed, sorted(stuck), f"a {engine} collective", at)
    if engine == DDP_ALLREDUCE:
        return _uneven_steps(job, finished, stuck, at)
    return (f"{ranks_named(sorted(stuck), job.unit)} {'wait' if len(stuck) > 1 else 'waits'} "
            f"in a {engine} collective that {ranks_named(finished, job.unit)} will never enter: "
            f"{'they' if len(finished) > 1 else 'it'} finished the job's code ({at}); the job "
            f"was stopped. {UNEVEN_FIX}")


#: The fix said when ranks did not end after a preemption notice's save.
_SAVE_FIX = ("Fix: save on every rank (checkpoint.save on every rank: rank 0 writes, the others "
             "skip); a collective inside the save on some ranks only waits forever.")


def _stuck_in_the_save(job: JobState, noticed: list[int], stuck: list[int], what: str,
                       at: str, fix: str = _SAVE_FIX) -> str:
    """The verdict on ranks that did not end after the save of a preemption notice, which
    ``noticed`` ended on (their part of it done)."""
    plural = len(stuck) > 1
    return (f"{ranks_named(stuck, job.unit)} {'wait' if plural else 'waits'} in {what} after "
            f"the preemption notice, while {ranks_named(noticed, job.unit)} ended on it once "
            f"{'their' if len(noticed) > 1 else 'its'} part of the save was done ({at}); the "
            f"job was stopped. {fix}")


def _uneven_steps(job: JobState, finished: list[int],
                  stuck: dict[int, tuple[str, int | None]], at: str) -> str:
    """The verdict on DDP ranks left in a training step's gradient allreduce by peers that
    finished: who waits for whom, and the steps each took."""
    def took(rank: int) -> str:
        steps = job.ranks[rank].ddp_steps
        return f"{rank_named(rank, job.unit)} after {steps} steps" if steps else \
            rank_named(rank, job.unit)

    waiting = sorted(stuck)
    doing = ", ".join(f"{rank_named(rank, job.unit)} is in its step {stuck[rank][1]}"
                      for rank in waiting if stuck[rank][1])
    plural = len(waiting) > 1
    return (f"{ranks_named(waiting, job.unit)} {'wait' if plural else 'waits'} in "
            f"{DDP_ALLREDUCE} (inside backward()) for {ranks_named(finished, job.unit)}, which "
            f"finished the job's code ({', '.join(took(rank) for rank in finished)})"
            f"{'; ' + doing if doing else ''}. {'They' if plural else 'It'} would wait for "
            f"ever: the job was stopped ({at}). {UNEVEN_DDP_FIX}")


def mismatched(job: JobState, backend: Backend, events: queue.Queue, now: float,
               seen: dict[str, Any]) -> str | None:
    """Why the job cannot end, when every rank has stalled (silent for the stall time) in a
    collective of another name than a peer's (``all_reduce`` against ``broadcast``), found
    twice :data:`LEFT_BEHIND_S` apart; else ``None``."""
    running = job.running_ranks()
    if len(running) < 2 or job.finished_ranks() or not all(
            job.ranks[r].stalled_for(now, job.stall_after) is not None for r in running):
        seen.pop("mismatch", None)
        return None
    if now - seen.get("mismatch_asked", 0.0) < LEFT_BEHIND_S:
        return None
    seen["mismatch_asked"] = now
    mismatch = collect_stacks(job, backend, events).mismatch(job.unit)
    found, seen["mismatch"] = seen.get("mismatch"), mismatch
    if not mismatch or mismatch != found:
        return None
    return f"{mismatch[0].upper()}{mismatch[1:]}; the job was stopped. {UNEVEN_FIX}"


def _host_silent_after() -> float:
    """Seconds a host's supervisors may be silent before it is taken for lost."""
    return positive_seconds(os.environ.get(ENV_HOST_SILENT, HOST_SILENT_S), ENV_HOST_SILENT)


def lost_host(job: JobState, backend: Backend, now: float, silent_after: float) -> str | None:
    """The verdict on a host all of whose running ranks' supervisors have been silent for
    ``silent_after`` seconds while another host's were heard within half that (the driver
    itself was not the one that stalled), its ranks marked lost; else ``None``. Jobs on one
    host (the driver's ranks, local Spark) are never judged so."""
    heard = backend.heard_ago(now)
    hosts: dict[str, list[int]] = {}
    for rank in job.running_ranks():
        if rank in heard and job.ranks[rank].host:
            hosts.setdefault(job.ranks[rank].host, []).append(rank)
    if len(hosts) < 2:
        return None
    quiet = {host: min(heard[r] for r in ranks) for host, ranks in hosts.items()}
    silent = [host for host, seconds in quiet.items() if seconds > silent_after]
    if not silent or min(quiet.values()) > silent_after / 2:
        return None
    host = max(silent, key=quiet.__getitem__)
    verdict = job.lose_host(host, sorted(hosts[host]), quiet[host])
    backend.lose_host(host)
    return verdict


def probe_links(job: JobState, backend: Backend) -> None:
    """Once every rank of a job on several hosts waits in communication for most of its
    steps, measure the hosts' links (once per job); say the verdict when that is done."""
    probe = job.link_probe
    if probe is None:
        hosts: dict[str, int] = {}
        for rank in job.running_ranks():
            if job.ranks[rank].host:
                hosts.setdefault(job.ranks[rank].host, rank)
        share = job.splits.comm_bound(COMM_BOUND_SHARE) if len(hosts) > 1 else None
        if share is not None:
            job.link_probe, job.link_share = LinkProbe(hosts, backend.probe_link), share
            job.link_probe.start()
    else:
        _say_links(job)


def preempt_on_notice(job: JobState, backend: Backend, now: float) -> None:
    """Once Spark decommissions an executor of the job, tell every rank the call of
    ``checkpoint.preempting()`` at which they all save (:mod:`hvd_magics.job.preemption`), and
    say so in the cell; once per job."""
    watch = job.preemption
    if watch.notice or now - watch.checked < CHECK_EVERY_S:
        return
    watch.checked = now
    tasks = {r.rank: r.task for r in job.ranks if r.task is not None and not r.exited}
    found = backend.decommissioning(tasks)
    if not found:
        return
    watch.notice = notice_text(found, job.unit)
    watch.at = watch.target(now)
    if watch.at is None:
        say(f"{watch.notice}; the job does not call checkpoint.preempting(), so it goes on "
            f"until the executor is gone (a restart resumes from the last checkpoint)")
        return
    backend.preempt(watch.at, watch.notice)
    say(f"{watch.notice}: every {job.unit} saves at its call {watch.at:,} of "
        f"checkpoint.preempting() and the attempt ends there")


def _say_links(job: JobState) -> None:
    """The links' verdict, once their probe is done."""
    if job.link_probe is not None and job.link_probe.done.is_set() and not job.links:
        job.links = link_verdict(job.link_probe.speeds, job.link_share, job.unit)


def _ask_stalled(job: JobState, backend: Backend, now: float, asked: set[int]) -> None:
    """Take the stacks of ranks that just went silent (their answer tells the views where they
    are); a rank that speaks again may be asked again when it next goes silent."""
    stalled = {r.rank for r in job.ranks if r.stalled_for(now, job.stall_after) is not None}
    asked &= stalled
    if stalled - asked:
        job.request_stacks(backend, STALL_REQUEST)
        asked |= stalled


def _watch(job: JobState, backend: Backend, events: queue.Queue, start_timeout: float,
           timeout: float | None = None, stop: threading.Event | None = None) -> None:
    """Follow the job until every rank exited; raise when it failed (``launch`` stops it)."""
    started = time.monotonic()
    failed_since: float | None = None
    saving_since: float | None = None
    ended_at: float | None = None
    finished_since: float | None = None
    asked: set[int] = set()
    behind: dict[str, Any] = {}
    unmatched: dict[str, Any] = {}
    unpacking = backend.unpacking()
    shown, told = started - UNPACKING_SHOWN_EVERY_S, False  # said at once, then every 5 s
    silent_after = _host_silent_after()
    while not job.all_exited:
        now = _follow(job, events)
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt  # stopped from another thread: ended as an interrupt
        _ask_stalled(job, backend, now, asked)
        if failed_since is None:
            lost_host(job, backend, now, silent_after)
            probe_links(job, backend)
            preempt_on_notice(job, backend, now)
        stuck = (left_behind(job, backend, events, now, behind)
                 or mismatched(job, backend, events, now, unmatched)) if failed_since is None \
            else None
        if stuck:
            raise HorovodJobError(stuck, log_path=str(job.log_path))
        if timeout is not None and now - started > timeout and failed_since is None:
            stacks = collect_stacks(job, backend, events)
            raise JobTimeoutError(
                f"The job ran past its timeout of {timeout:g} s and was stopped (raise it with "
                f"%%horovod --timeout SECONDS or HorovodRunner(np, timeout=SECONDS)). Where each "
                f"{job.unit} was:\n{stacks.summary(job.unit)}", log_path=str(job.log_path))
        if failed_since is None and job.any_failed:
            if _saving_on_notice(job):  # ranks ended on the notice; rank 0 still writes
                saving_since = saving_since or now
                if now - saving_since > _notice_save_wait():
                    raise HorovodJobError(_save_too_long(job, backend, events, now - saving_since),
                                          log_path=str(job.log_path))
            else:
                failed_since = now
        if failed_since is not None and now - failed_since >= FAILURE_GRACE_S:
            break
        if backend.finished and ended_at is None:
            ended_at = now
        if ended_at is not None and finished_since is None and (
                backend.drained or now - ended_at >= DRAIN_WAIT_S):
            finished_since = now  # everything the ranks sent has arrived (or never will)
        if finished_since is not None and now - finished_since >= FAILURE_GRACE_S:
            break  # the job ended but some ranks never reported their exit
        # With DataFrames, the clock starts when their rows reach the tasks (after the
        # user's Spark stages, which take what they take).
        clock = job.data_arrived_at if backend.reads_data else started
        if not backend.live:
            clock = None  # nothing arrives before the end: Spark's own scheduling decides
        unheard = [r.rank for r in job.ranks if r.state == WAITING and not r.exited]
        extra, doing = unpacking if unpacking is not None and unheard else (0.0, "")
        if doing and clock is not None and now - shown >= UNPACKING_SHOWN_EVERY_S:
            shown, told = now, True
            say(f"{doing}: {now - clock:.0f} s so far (the start timeout of "
                f"{start_timeout:.0f} s counts from when they have it; {extra:.0f} s allowed "
                "for it)", redraw=True)
        elif told and not unheard:
            told = False
            say(f"every executor of the job has the environment ({now - started:.0f} s)",
                redraw=True)
            print(file=sys.stderr, flush=True)
        if not job.all_started and clock is not None and now - clock > start_timeout + extra:
            waiting = [r.rank for r in job.ranks if r.pid is None and not r.exited]
            took = (f" ({start_timeout:.0f} s, and {extra:.0f} s while {doing})" if doing
                    else "")
            raise StartTimeoutError(
                f"Timed out after {start_timeout + extra:.0f} s{took} waiting for ranks "
                f"{_ranks(waiting)} to start ({job.size - len(waiting)} of {job.size} started "
                f"on {backend.where}). " + backend.silence_note(unheard) +
                "If the cluster needs longer to schedule the tasks, raise start_timeout "
                "(%%horovod --start-timeout SECONDS).", log_path=str(job.log_path))
    failures = job.failures()
    if not failures and job.all_exited:
        return
    refused = backend.refused
    if refused and not failures:
        job.refused = True
        raise DataRefused(refused, log_path=str(job.log_path))
    spark_failure = backend.describe_failure()
    if spark_failure and not failures:
        began = any(r.pid is not None for r in job.ranks)
        what = "failed before the ranks finished" if began else "ended before any rank started"
        raise HorovodJobError(f"The Spark job {what}: {spark_failure}",
                              log_path=str(job.log_path))
    if not failures:
        missing = [r.rank for r in job.ranks if not r.exited]
        raise HorovodJobError(f"Ranks {_ranks(missing)} ended without reporting an exit code.",
                              log_path=str(job.log_path))
    first = failures[0]
    if spark_failure and first.error == LOST and backend.took_every_rank():
        # the Connect server went, and every rank's task with it: it is named, not a rank
        raise HorovodJobError(f"{spark_failure[0].upper()}{spark_failure[1:]}", failures,
                              str(job.log_path))
    if spark_failure:
        for failure in failures:
            if failure.error == LOST:
                failure.message += f" (Spark: {spark_failure})"
    lead = f"{job.lost_host[0].upper()}{job.lost_host[1:]}; the job was stopped. " \
        if job.lost_host else ""
    raise HorovodJobError(
        f"{lead}{_uneven_note(job, first)}{job.failed_count()}; the first was "
        f"{first.headline()}{hint_for(first)}", failures, str(job.log_path))


def _notice_save_wait() -> float:
    try:
        return float(os.environ.get(ENV_NOTICE_SAVE_WAIT, NOTICE_SAVE_WAIT_S))
    except ValueError:
        return NOTICE_SAVE_WAIT_S


def _saving_on_notice(job: JobState) -> bool:
    """Whether every rank that ended so far ended on a preemption notice (its part of the
    save done) and some still run: rank 0 writing the checkpoint, which may take minutes."""
    ended = [r for r in job.ranks if r.failed]
    return bool(ended) and all(r.stopped_on_notice for r in ended) and \
        any(not r.exited for r in job.ranks)


def _save_too_long(job: JobState, backend: Backend, events: queue.Queue, waited: float) -> str:
    """The verdict on ranks still running :data:`NOTICE_SAVE_WAIT_S` after the others ended
    on the notice, with where they are."""
    running = job.running_ranks()
    stacks = collect_stacks(job, backend, events)
    at = "; ".join(f"{rank_named(rank, job.unit)} in "
                   f"{stack_where(stacks.ranks[rank].get('threads', []))}"
                   for rank in running if rank in stacks.ranks) or "no stack came back"
    return _stuck_in_the_save(
        job, job.ended_on_notice(), running, f"its save for more than {waited:.0f} s", at,
        f"Fix: give a save that takes longer more time: {ENV_NOTICE_SAVE_WAIT}=SECONDS in the "
        f"notebook's environment (default {NOTICE_SAVE_WAIT_S:.0f}).")


def _uneven_note(job: JobState, first: RankFailure) -> str:
    """``"rank 1 had finished ... "`` when ranks had finished the job's code before ``first``
    failed in a collective: an order of events, not a verdict (ranks that make different calls
    are caught while they wait, with the evidence: :func:`left_behind`)."""
    finished = [rank for rank in job.finished_ranks() if rank != first.rank]
    if not finished or "ollective" not in f"{first.error} {first.message}":
        return ""
    return (f"{ranks_named(finished, job.unit)} had finished the job's code when {job.unit} "
            f"{first.rank}'s collective failed. ")


def _watch_elastic(job: JobState, backend: Backend, events: queue.Queue,
                   stop: threading.Event | None = None) -> None:
    """Follow an elastic job until Horovod's elastic driver and the stage ended; raise when
    the job failed as a whole (a rank lost on the way is a reset, not a failure)."""
    ended_at: float | None = None
    silent_after = _host_silent_after()
    while True:
        now = _follow(job, events)
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if ended_at is None:
            lost_host(job, backend, now, silent_after)  # a reset without its ranks, not an end
        if backend.finished and ended_at is None:
            ended_at = now
        if ended_at is not None and (backend.drained or now - ended_at >= DRAIN_WAIT_S):
            break
    _drain(job, events)
    failure = backend.describe_failure()
    if failure:
        raise HorovodJobError(f"The elastic job failed: {failure}", job.failures(),
                              str(job.log_path))
    if not any(r.has_result and r.exit_code == 0 for r in job.ranks):
        failures = job.failures()
        summary = (f"every rank of the elastic job failed; the first was "
                   f"{failures[0].headline()}" if failures else
                   "the elastic job ended without a rank that finished")
        if any(r.peer_lost for r in job.ranks if r.failed):
            summary += ELASTIC_RUN_HINT
        raise HorovodJobError(summary[0].upper() + summary[1:], failures, str(job.log_path))


def _finish(record: RunRecord, job: JobState) -> None:
    record.ended_at = datetime.now()
    record.resets = [dict(reset) for reset in job.resets]
    if job.elastic and job.formations:
        record.final_size = job.current_size
    record.exit_codes = {r.rank: r.exit_code for r in job.ranks}
    record.hosts = {r.rank: r.host for r in job.ranks}
    record.pids = {r.rank: r.pid for r in job.ranks if r.pid is not None}
    timeline = job.finish_timeline()
    record.timeline_path = str(timeline) if timeline else None
    record.shards = job.shard_summary()
    record.epochs = job.timer.rows()
    record.charts_html = job.history.html()
    hosts = {r.rank: r.host for r in job.ranks}
    record.step_split = job.splits.rank_rows(hosts)
    record.step_intervals = [{**row, "host": hosts.get(row["rank"], "")}
                             for row in job.splits.intervals]
    record.stragglers = job.splits.verdicts(job.unit)
    _say_links(job)  # a probe that ended with the job
    record.links = job.links
    split = job.timer.split(time.monotonic())
    record.startup_s, record.training_s = split["startup_s"], split["training_s"]
    if record.status == "running":
        record.status = "succeeded"
    job.settle(record.status)
    job.end()


def _reap_local_ranks(job: JobState, backend: Backend) -> None:
    """Make sure the job's rank processes on this host are gone before the driver says the job
    is over (unless the backend keeps its ranks: a warm pool's)."""
    if not backend.keeps_ranks:
        reap_local_ranks([(r.pid, r.host) for r in job.ranks])


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"
