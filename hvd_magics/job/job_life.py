"""One job's life on the driver: its backend made, its ranks started and watched, stopped
unless they ended by themselves, and its record finished, whatever happens."""
from __future__ import annotations

import queue
import time
import uuid
import warnings
from datetime import datetime

from hvd_magics.errors import HorovodJobError, HorovodMagicsError, JobInterrupted, PayloadError
from hvd_magics.job.job_state import PREEMPTED, JobState
from hvd_magics.job.launch_request import LaunchRequest
from hvd_magics.job.live_job import STOP_WAIT_S
from hvd_magics.job.records.mlflow_run import MlflowTracker
from hvd_magics.job.restarts import preempted
from hvd_magics.job.records.run_logs import prune_old_runs, runs_dir
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.session import SESSION
from hvd_magics.job.verdicts.links import say_links
from hvd_magics.job.following import collect_stacks, drain
from hvd_magics.job.watch.loop import watch, watch_elastic
from hvd_magics.launch.backend import Backend
from hvd_magics.launch.dataframe_input import check_columns, common_session
from hvd_magics.launch.driver_backend import DriverBackend
from hvd_magics.launch.local_ranks import reap_local_ranks
from hvd_magics.launch.spark_backend import SparkBackend
from hvd_magics.launch.spark_session import active_session, start_local_session
from hvd_magics.options import ElasticSize
from hvd_magics.protocol import ENV_EVERY_RESULT
from hvd_magics.rank_names import ranks_named
from hvd_magics.result_codec import ResultDecodeError
from hvd_magics.task.engines import engine_of

#: A rank's errors that mean the executors' Python lacks a module.
IMPORT_ERRORS = ("ModuleNotFoundError", "ImportError")
#: How long the ranks' stacks are waited for at an interrupt, which should stop the job at once.
INTERRUPT_STACKS_WAIT_S = 1.0


def make_backend(request: LaunchRequest) -> Backend:
    """Where the job's ranks run: a warm pool's, Spark tasks (elastic or not, reading
    DataFrames or not) or the driver's processes."""
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
                                   request.options.elastic_timeout, request.options.reset_limit,
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
                            ranks_per_task=request.options.ranks_per_task,
                            ignore_ssl=request.ignore_ssl)
    if np < 0:
        return DriverBackend(-np, env)
    spark = active_session() or start_local_session(np)
    return SparkBackend(spark, np, env, slot_wait_s=request.slot_wait_s,
                        held_slots=SESSION.held_slots(request.live),
                        background=request.live is not None,
                        environment=SESSION.environment,
                        ranks_per_task=request.options.ranks_per_task,
                        gone_wait_s=request.start_timeout, ignore_ssl=request.ignore_ssl)


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
    """Run one job to its end and return its record; raise when it failed (the error carries
    the record as ``record``).

    Whatever happens, the views are ended and the log is closed before this returns or raises.
    """
    elastic, size = request.elastic, request.np
    job_id = uuid.uuid4().hex[:12]
    backend = make_backend(request)
    prune_old_runs()
    log_path = runs_dir() / job_id / "ranks.log"
    engine = engine_of(request.env)
    tracker = _tracker(request, job_id, backend.where, engine)
    job = JobState(abs(size), log_path, request.views + ([tracker] if tracker else []),
                   backend.where, elastic, timeline_dest=request.options.timeline,
                   stall_after=request.options.stall_after, engine=engine)
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
        (watch_elastic(job, backend, events, stop) if elastic else
         watch(job, backend, events, request.start_timeout, request.options.timeout, stop))
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
        if isinstance(failure, HorovodMagicsError):
            failure.record = record  # a restart reads the failed attempt's record from it
        note = note or (_diverged_note(job) if backend.keeps_ranks else "")
        if isinstance(failure, HorovodJobError):
            if note:
                failure.add_summary(note)
            if any(f.error in IMPORT_ERRORS for f in failure.failures):
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
    drain(job, events)
    if not clean:
        _reap_local_ranks(job, backend)


def _where_on_interrupt(job: JobState, backend: Backend, events: queue.Queue) -> str:
    """``" Where each rank was:"`` and a line per rank, or ``""`` when none answered (the ranks
    had gone already: on classic Spark, pyspark cancels the job at the interrupt)."""
    stacks = collect_stacks(job, backend, events, INTERRUPT_STACKS_WAIT_S)
    if not stacks.ranks:
        return ""
    return f"Where each {job.unit} was:\n" + stacks.summary(job.unit) + "\n"


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
    say_links(job)  # a probe that ended with the job
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
