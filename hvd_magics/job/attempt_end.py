"""An attempt's end settled on the driver: its ranks stopped unless they ended by themselves
(and none left on this host), where each was at an interrupt, what a warm pool's diverged ranks
mean, and the record filled from what the job's state holds."""
from __future__ import annotations

import queue
import time
from datetime import datetime

from hvd_magics.job.following import collect_stacks, drain
from hvd_magics.job.job_state import JobState
from hvd_magics.job.rank_state import shard_summary
from hvd_magics.job.live_job import STOP_WAIT_S
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.verdicts.links import say_links
from hvd_magics.job.views.charts import charts_html
from hvd_magics.launch.backend import Backend
from hvd_magics.launch.local_ranks import reap_local_ranks
from hvd_magics.rank_names import ranks_named

#: How long the ranks' stacks are waited for at an interrupt, which should stop the job at once.
INTERRUPT_STACKS_WAIT_S = 1.0


def diverged_note(job: JobState) -> str:
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


def wind_down(backend: Backend, job: JobState, events: queue.Queue, clean: bool) -> None:
    """Stop the job unless it ended by itself, wait for the Spark job, take what arrived, and
    make sure no rank process is left on this host."""
    if not clean:
        backend.stop()
    ended = backend.join(STOP_WAIT_S)
    if not ended:
        backend.stop()
    drain(job, events)
    if not clean:
        reap_ranks(job, backend)


def where_on_interrupt(job: JobState, backend: Backend, events: queue.Queue) -> str:
    """``" Where each rank was:"`` and a line per rank, or ``""`` when none answered (the ranks
    had gone already: on classic Spark, pyspark cancels the job at the interrupt)."""
    stacks = collect_stacks(job, backend, events, INTERRUPT_STACKS_WAIT_S)
    if not stacks.ranks:
        return ""
    return f"Where each {job.unit} was:\n" + stacks.summary(job.unit) + "\n"


def finish_record(record: RunRecord, job: JobState) -> None:
    record.ended_at = datetime.now()
    record.resets = [dict(reset) for reset in job.resets]
    if job.elastic and job.formations:
        record.final_size = job.current_size
    record.exit_codes = {r.rank: r.exit_code for r in job.ranks}
    record.hosts = {r.rank: r.host for r in job.ranks}
    record.pids = {r.rank: r.pid for r in job.ranks if r.pid is not None}
    timeline = job.timeline.finish()
    record.timeline_path = str(timeline) if timeline else None
    record.shards = shard_summary(job.ranks)
    record.epochs = job.timer.rows()
    record.charts_html = charts_html(job.history)
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


def reap_ranks(job: JobState, backend: Backend) -> None:
    """Make sure the job's rank processes on this host are gone before the driver says the job
    is over (unless the backend keeps its ranks: a warm pool's)."""
    if not backend.keeps_ranks:
        reap_local_ranks([(r.pid, r.host) for r in job.ranks])
