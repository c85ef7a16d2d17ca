"""The driver's picture of a running job, built only from events; it also writes the full log."""
from __future__ import annotations

import base64
import collections
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar, Final, Protocol

from hvd_magics.job.views.charts import MetricHistory
from hvd_magics.job.records.epoch_timing import EPOCH_LINE, EpochTimer
from hvd_magics.job.records.job_log import JobLog
from hvd_magics.causes import RANK_LOST, RankCause, rank_cause
from hvd_magics.errors import OUTPUT_TAIL_LINES, RankFailure
from hvd_magics.options import STALL_AFTER_S, ElasticSize
from hvd_magics.job.readings.stacks import where as stack_where
from hvd_magics.job.readings.preemption import PreemptionWatch
from hvd_magics.job.verdicts.straggler import StepSplits
from hvd_magics.protocol import (CHANNEL_CLOSED, DRIVER_LOG, EPOCH_BEGIN, EPOCH_END, ERROR, EXIT,
                                 LEAVING, LINK_PROBE, OUTPUT, OUTPUT_PARTIAL, PREEMPT_CALLS,
                                 PROGRESS, RESIZE, RESULT, RUN_LOG, SHARDING, SLOT_OFFER, STACKS,
                                 STARTED, STEP_SPLIT, TASK_ERROR, TASK_STARTED, TIMELINE_CHUNK,
                                 TIMELINE_LOCAL)
from hvd_magics.events import (ChannelClosedEvent, ErrorEvent, ExitEvent, LeavingEvent,
                               LinkProbeEvent, OutputEvent, OutputPartialEvent, PreemptCallsEvent,
                               ResultEvent, RunLogEvent, ShardingEvent, ShardReport,
                               SlotOfferEvent, StartedEvent, TaskErrorEvent, TaskStartedEvent,
                               TimelineChunkEvent, TimelineLocalEvent, to_wire)
from hvd_magics.launch.backend import Backend
from hvd_magics.rank_names import ranks_named, unit_of
from hvd_magics.job.readings.output_lines import (BAR, NOISE, SHOW, WARNING, OutputSorter,
                                                 bar_count, plain)

#: Rank states, in the order a healthy rank goes through them (``ready``: an elastic job's task
#: offered its slot and waits to be given a rank).
WAITING, SHARDING_DATA, READY, STARTING, RUNNING, DONE, FAILED = (
    "waiting", "sharding", "ready", "starting", "running", "done", "failed")
#: The last state of a rank that had not finished when its job was interrupted, or stopped
#: because another rank failed.
INTERRUPTED, STOPPED = "interrupted", "stopped"
#: The last state of a rank that saved (its part) and ended on a preemption notice, on purpose;
#: also how such an attempt ended (the record's ``status``).
PREEMPTED = "preempted"
#: The prefix of the stack requests the driver makes for a rank found stalled.
STALL_REQUEST = "stall-"
#: Characters of one output line kept in memory for display (the log file has every line whole).
DISPLAY_LINE_CHARS = 2000
#: Keys an ``output`` event gains once applied: its lines the cell shows (start-up chatter, bars,
#: copies of warnings and of other ranks' lines left out; a warning as one short line), and its
#: lines that are the rank's own output (chatter and bars left out).
SHOWN: Final = "shown"
KEPT: Final = "kept"
#: Error name of a rank whose supervisor vanished (its Spark executor was lost or killed).
LOST = RANK_LOST


def display_line(line: str, limit: int = DISPLAY_LINE_CHARS) -> str:
    """``line`` cut to ``limit`` characters for display, saying how long it was."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]} ... [{len(line):,} characters; the whole line is in the log file]"


class JobView(Protocol):
    """Something that shows a job to the user (text printer, widgets)."""

    def on_event(self, job: JobState, event: dict[str, Any]) -> None: ...

    def on_tick(self, job: JobState) -> None: ...

    def on_end(self, job: JobState) -> None: ...


@dataclass
class RankState:
    """What the driver knows of one rank."""

    rank: int
    host: str = ""
    state: str = WAITING
    #: In an elastic job, ``rank`` is the Spark task and this is its Horovod rank now (``None``:
    #: not one of the ranks).
    hvd_rank: int | None = None
    #: In an elastic job, how many times Spark ran this task (a lost task runs again).
    attempt: int = 0
    unit: str = "rank"
    pid: int | None = None
    exit_code: int | None = None
    #: How it ended when its exit code is not known for sure (a zygote's keeper gone silent).
    exit_how: str = ""
    error: dict[str, Any] | None = None
    task_error: str = ""
    lost: str = ""
    #: Whether it was lost with its host (its link or machine), not alone.
    host_lost: bool = False
    has_result: bool = False
    #: Whether its function returned and it now leaves the engine (``leaving``).
    left: bool = False
    #: The DDP training steps it took, as it said when leaving (``None``: none, or unknown).
    ddp_steps: int | None = None
    failed_at: float | None = None
    epoch: int = 0
    epochs: int | None = None
    step: int = 0
    steps: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    samples_per_s: float | None = None
    partial: str = ""
    shards: list[ShardReport] = field(default_factory=list)
    #: Its Spark task attempt id (``None``: a rank on the driver, or not started yet).
    task: int | None = None
    reports_epochs: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    #: Where the rank was when it was last found stalled (its innermost frame of the user's).
    stalled_at: str = ""
    tail: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=OUTPUT_TAIL_LINES))

    @property
    def exited(self) -> bool:
        return self.exit_code is not None or bool(self.task_error or self.lost)

    @property
    def failed(self) -> bool:
        if self.error is not None or self.task_error or self.lost:
            return True
        return self.exit_code is not None and (self.exit_code != 0 or not self.has_result)

    @property
    def cause(self) -> RankCause:
        """Why it failed, as far as it has (:func:`hvd_magics.causes.rank_cause`); meaningful
        once :attr:`failed`."""
        if self.error is None:  # died, its task failed, or lost with its executor or host
            return rank_cause(LOST if self.lost else "", host_lost=self.host_lost)
        return rank_cause(str(self.error.get("error", "")), str(self.error.get("message", "")),
                          str(self.error.get("traceback", "")))

    @property
    def peer_lost(self) -> bool:
        """Whether this rank only failed because another rank went away first."""
        return self.error is not None and self.cause is RankCause.PEER_LOST

    @property
    def stopped_on_notice(self) -> bool:
        """Whether this rank ended on purpose at a preemption notice (``Preempted``): not a
        cause, when another rank failed (rank 0 lost while it wrote the checkpoint, say)."""
        return self.error is not None and self.cause is RankCause.PREEMPTED

    @property
    def failed_state(self) -> str:
        """The state it ends in when it failed: ``preempted`` when it ended on a notice."""
        return PREEMPTED if self.stopped_on_notice else FAILED

    def stalled_for(self, now: float, after: float = STALL_AFTER_S) -> float | None:
        """Seconds this running rank has been silent, when that (more than ``after``) makes it
        stalled."""
        silent = now - self.last_seen
        return silent if self.state == RUNNING and silent > after else None

    def progress_line(self) -> str:
        """Where this running rank is in its epoch, as a live line (``""`` when it reports no
        steps): ``epoch 2/5 step 40/100 loss 0.4312``."""
        if self.state != RUNNING or not self.reports_epochs or not self.step:
            return ""
        epoch = f"epoch {self.epoch}" + (f"/{self.epochs}" if self.epochs else "")
        step = f"step {self.step}" + (f"/{self.steps}" if self.steps else "")
        metrics = " ".join(f"{name} {value:.4g}" for name, value in list(self.metrics.items())[:3])
        return " ".join(part for part in (epoch, step, metrics) if part)

    def failure(self) -> RankFailure:
        err = self.error or ({"error": LOST, "message": self.lost} if self.lost else {})
        return RankFailure(self.rank, self.host, self.exit_code, err.get("error", ""),
                           err.get("message", ""), err.get("traceback", "") or self.task_error,
                           list(self.tail), self.unit, self.exit_how, self.host_lost)


class JobState:
    """Apply events to per-rank state, keep rank 0's value, and append every line to the log.

    Parameters
    ----------
    size : int
        Number of ranks.
    log_path : Path
        File that receives every output line of every rank (``<time> [rank@host] line``).
    views : sequence of JobView
        Told of every event and of the end.
    where : str
        Where the job runs, as the views say it.
    elastic : ElasticSize, optional
        An elastic job: ``size`` is its maximum and each row is a Spark task, whose Horovod
        rank changes as the job re-forms (``resize`` events).
    """

    def __init__(self, size: int, log_path: Path, views: list[JobView] | None = None,
                 where: str = "", elastic: ElasticSize | None = None,
                 timeline_dest: Path | None = None,
                 stall_after: float = STALL_AFTER_S, engine: str = "horovod") -> None:
        self.size = size
        #: What the ranks run on: ``"horovod"``, ``"torch"`` or ``"tf"``.
        self.engine = engine
        self.where = where
        self.elastic = elastic
        self.unit = unit_of(elastic is not None)
        self.ranks = [RankState(r, unit=self.unit) for r in range(size)]
        #: Every formation of an elastic job's ranks (the first is its start), as the driver
        #: sent them: ``reset``, ``size``, ``ranks`` (task -> rank), ``causes``, ``time``.
        self.formations: list[dict[str, Any]] = []
        self.views = list(views or [])
        #: Sorts the ranks' output lines for the cell
        #: (see :mod:`hvd_magics.job.views.output_lines`).
        self.output = OutputSorter(size)
        self.log_path = log_path
        self._log = JobLog(log_path)  # closed in end()
        #: Each rank's value parts (:mod:`hvd_magics.result_codec`), of the ranks that sent
        #: theirs: rank 0 (an elastic job's final rank 0, whichever task it is), or every rank
        #: for a job that asked for every rank's value.
        self.rank_parts: dict[int, dict[str, dict[str, Any]]] = {}
        self.started_at = time.monotonic()
        self.timer = EpochTimer(self.started_at)
        #: What the charts draw (loss and metrics, samples/s per rank).
        self.history = MetricHistory(self.started_at)
        #: Each rank's steps split into input, compute and communication, and the straggler.
        self.splits = StepSplits(self.started_at, size if elastic is None else None)
        #: The measure of the hosts' links, once every rank waited in communication
        #: (:mod:`hvd_magics.job.verdicts.link_probe`), the least share of a step they did, and the
        #: verdict once it is done (``""`` before).
        self.link_probe: Any = None
        self.link_share = 0.0
        self.links = ""
        #: Where the driver puts rank 0's Horovod Timeline, when the job records one.
        self.timeline_dest = timeline_dest
        self._timeline_file: Any = None
        self._timeline_local: str | None = None
        #: How the job ended as a whole (``"succeeded"``, ``"failed"``, ``"interrupted"``,
        #: ``"preempted"``), set
        #: before :meth:`end`: an elastic job that lost ranks on the way may still succeed.
        self.outcome: str | None = None
        #: When the first Spark task began receiving the job's DataFrame rows.
        self.data_arrived_at: float | None = None
        #: Whether the job's rows were refused before any rank got the job (the views then
        #: leave nothing in the cell but the error).
        self.refused = False
        #: Request id -> rank -> its ``stacks`` event (see :meth:`request_stacks`).
        self.stacks: dict[str, dict[int, dict[str, Any]]] = {}
        #: Seconds of silence after which a running rank is stalled (its stacks are taken).
        self.stall_after = stall_after
        #: A job with restarts, on a later attempt: why each earlier attempt ended.
        self.earlier_attempts: tuple[str, ...] = ()
        #: The verdict on a host whose supervisors went silent (:meth:`lose_host`), or ``""``.
        self.lost_host = ""
        #: The ranks' ``checkpoint.preempting()`` calls and the preemption notice sent
        #: (:mod:`hvd_magics.job.verdicts.preemption`).
        self.preemption = PreemptionWatch()

    def handle(self, event: dict[str, Any]) -> None:
        """Apply one event (dispatched on its kind through :attr:`_HANDLERS`)."""
        if event.get("kind") == RESIZE:
            self._on_resize(event)
            for view in self.views:
                view.on_event(self, event)
            return
        if event.get("kind") == DRIVER_LOG:  # the driver's own word, for the log file only
            stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", time.time())))
            self._log.write(f"{stamp} [driver] {event.get('text', '')}\n")
            return
        rank = event.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            return
        state = self.ranks[rank]
        event.setdefault("recv", time.monotonic())
        if event["kind"] == STACKS:  # an answer, not a sign of life: the stall clock runs on
            self._on_stacks(state, event)
            for view in self.views:
                view.on_event(self, event)
            return
        state.last_seen = event["recv"]
        state.stalled_at = ""
        self.timer.observe(event)
        state.host = event.get("host", state.host) or state.host
        handler = self._HANDLERS.get(event["kind"])
        if handler is not None:
            handler(self, state, event)
        if state.failed_at is None and state.failed:
            state.failed_at = state.last_seen
        for view in self.views:
            view.on_event(self, event)

    def _on_output(self, state: RankState, event: OutputEvent) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", time.time())))
        state.partial = ""
        shown, kept = [], []
        for line in event.get("lines", []):
            self._log.write(f"{stamp} [{state.rank}@{state.host}] {line}\n")
            sort, text = self.output.sort(state.rank, line, self.peer_lost)
            if sort == BAR:
                self._bar(state, text)
                continue
            if sort != NOISE:  # the tail is what an error shows; kept: the rank's own lines
                state.tail.append(display_line(line))
                kept.append(display_line(line))
            if sort in (SHOW, WARNING):
                shown.append(text)
            match = EPOCH_LINE.match(line)
            if match and not state.reports_epochs:
                state.epoch, state.epochs = int(match.group(1)), int(match.group(2))
        event[SHOWN], event[KEPT] = shown, kept

    def _on_run_log(self, state: RankState, event: RunLogEvent) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", time.time())))
        for line in event.get("lines", []):
            self._log.write(f"{stamp} [{state.rank}@{state.host}] {line}\n")

    def _on_output_partial(self, state: RankState, event: OutputPartialEvent) -> None:
        self._bar(state, plain(event.get("text", "")))

    @staticmethod
    def _bar(state: RankState, text: str) -> None:
        """A rank's live line (a bar); its count moves the rank's steps when the rank reports
        none itself."""
        state.partial = display_line(text)
        count = bar_count(text)
        if count is not None and not state.reports_epochs:
            state.step, state.steps = count

    def lose_host(self, host: str, ranks: list[int], silent_s: float) -> str:
        """The supervisors of ``host``'s ``ranks`` have been silent for ``silent_s`` seconds
        while other hosts' answered: its link or machine was lost. Each of its ranks is lost
        (the first failures, before the survivors' consequences); return the verdict."""
        text = (f"host {host} ({ranks_named(ranks, self.unit)}) stopped answering "
                f"{silent_s:.0f} s ago: its link or machine was lost")
        now = time.monotonic()
        for rank in ranks:
            state = self.ranks[rank]
            if not state.exited:
                state.lost, state.failed_at, state.state = text, now, FAILED
                state.host_lost = True
        self.lost_host = text
        return text

    def _on_channel_closed(self, state: RankState, event: ChannelClosedEvent) -> None:
        if not event.get("clean") and not state.exited:
            where = f" on {state.host}" if state.host else ""
            task = (f"Spark task {state.rank}" if self.elastic else
                    f"the Spark task of rank {state.rank}")
            state.lost = (f"{task}{where} ended without a word: its executor was lost or "
                          "killed")
            state.state = FAILED

    def _on_resize(self, event: dict[str, Any]) -> None:
        self.formations.append({k: event.get(k) for k in ("reset", "size", "ranks", "causes",
                                                          "time")})
        ranks = {int(task): rank for task, rank in (event.get("ranks") or {}).items()}
        for state in self.ranks:
            state.hvd_rank = ranks.get(state.rank)

    @property
    def resets(self) -> list[dict[str, Any]]:
        """The re-formings of an elastic job (its formations after the first)."""
        return self.formations[1:]

    @property
    def current_size(self) -> int:
        """How many ranks the job has now (an elastic job's latest formation)."""
        return self.formations[-1]["size"] if self.formations else self.size

    def _on_slot_offer(self, state: RankState, event: SlotOfferEvent) -> None:
        attempt = int(event.get("attempt") or 0)
        if attempt != state.attempt or state.exited:  # Spark ran the task again: a new row
            fresh = RankState(state.rank, host=state.host, unit=self.unit, attempt=attempt)
            fresh.tail, fresh.last_seen = state.tail, state.last_seen
            self.ranks[state.rank] = state = fresh
        state.state = READY

    def _on_sharding(self, state: RankState, event: ShardingEvent) -> None:
        state.state = SHARDING_DATA
        if self.data_arrived_at is None:
            self.data_arrived_at = event["recv"]

    def _on_task_started(self, state: RankState, event: TaskStartedEvent) -> None:
        state.state = STARTING
        state.shards = list(event.get("shards") or [])
        state.task = event.get("task")

    def _on_started(self, state: RankState, event: StartedEvent) -> None:
        state.state = RUNNING
        state.pid = event.get("pid")

    def _on_error(self, state: RankState, event: ErrorEvent) -> None:
        state.error = to_wire(event)
        state.state = state.failed_state

    def _on_task_error(self, state: RankState, event: TaskErrorEvent) -> None:
        state.task_error = event.get("traceback", "")
        state.state = FAILED

    def _on_result(self, state: RankState, event: ResultEvent) -> None:
        state.has_result = True
        parts = event.get("parts")
        if parts is not None:
            self.rank_parts[state.rank] = parts

    @property
    def result_parts(self) -> dict[str, dict[str, Any]]:
        """What rank 0 sent back: in an elastic job, the one task that sent parts (its final
        rank 0)."""
        if self.elastic:
            return next(iter(self.rank_parts.values()), {})
        return self.rank_parts.get(0, {})

    def _on_timeline_local(self, state: RankState, event: TimelineLocalEvent) -> None:
        if state.rank == 0:  # every rank is given a path; only rank 0 (the coordinator) writes
            self._timeline_local = event.get("path")

    def _on_timeline_chunk(self, state: RankState, event: TimelineChunkEvent) -> None:
        if self.timeline_dest is None:
            return
        if self._timeline_file is None:
            self.timeline_dest.parent.mkdir(parents=True, exist_ok=True)
            self._timeline_file = open(self.timeline_dest, "wb")  # noqa: SIM115
        self._timeline_file.write(base64.b64decode(event["data"]))

    def _on_progress(self, state: RankState, event: dict[str, Any]) -> None:
        self._progress(state, event["kind"], event)
        self.history.observe(state.rank, event, event["recv"])

    def _on_step_split(self, state: RankState, event: dict[str, Any]) -> None:
        parts = self.splits.observe(state.rank, event, {r.rank: r.host for r in self.ranks})
        if parts is not None:
            self.history.observe_own_work(state.rank, parts.own_s, event["recv"])

    def _on_preempt_calls(self, state: RankState, event: PreemptCallsEvent) -> None:
        self.preemption.observe(state.rank, int(event.get("calls", 0)), event["recv"])

    def _on_link_probe(self, state: RankState, event: LinkProbeEvent) -> None:  # noqa: ARG002
        if self.link_probe is not None:
            self.link_probe.answer(event)

    def _on_stacks(self, state: RankState, event: dict[str, Any]) -> None:
        self.stacks.setdefault(str(event.get("request")), {})[state.rank] = event
        where = stack_where(event.get("threads", []))
        if (str(event.get("request")).startswith(STALL_REQUEST) and where != state.stalled_at
                and state.stalled_for(event["recv"], self.stall_after) is not None):
            state.stalled_at = where
            self._log.write(f"{time.strftime('%H:%M:%S')} [{state.rank}@{state.host}] "
                            f"hvd_magics: silent for {self.stall_after:.0f} s, in "
                            f"{state.stalled_at}\n")

    def request_stacks(self, backend: Backend, prefix: str = "") -> str:
        """Ask the backend's ranks for their stacks; the request id, whose answers
        :attr:`stacks` gathers."""
        request = f"{prefix}{uuid.uuid4().hex[:8]}"
        self.stacks[request] = {}
        backend.request_stacks(request)
        return request

    def running_ranks(self) -> list[int]:
        """Ranks whose process started and has not exited."""
        return [r.rank for r in self.ranks if not r.exited and r.pid is not None]

    def starting_ranks(self) -> list[int]:
        """Ranks whose process has not started yet."""
        return [r.rank for r in self.ranks if not r.exited and r.pid is None]

    def _on_leaving(self, state: RankState, event: LeavingEvent) -> None:
        state.left = True
        state.ddp_steps = event.get("steps")

    def ended_on_notice(self) -> list[int]:
        """Ranks that ended on purpose at a preemption notice, their part of the save done."""
        return [r.rank for r in self.ranks if r.stopped_on_notice]

    def finished_ranks(self) -> list[int]:
        """Ranks whose code returned: leaving their engine, or ended with success (a pool's
        rank whose cell ended)."""
        return [r.rank for r in self.ranks if r.left or (r.exited and not r.failed)]

    def _on_exit(self, state: RankState, event: ExitEvent) -> None:
        state.exit_code = event.get("code")
        state.exit_how = str(event.get("how") or "")
        state.state = state.failed_state if state.failed else DONE

    #: Event kind -> how it changes the job (``log`` changes nothing here: views show it); each
    #: handler reads its kind's record (hvd_magics.events).
    _HANDLERS: ClassVar[dict[str, Callable[[JobState, RankState, Any], None]]] = {
        OUTPUT: _on_output, OUTPUT_PARTIAL: _on_output_partial, RUN_LOG: _on_run_log,
        CHANNEL_CLOSED: _on_channel_closed, SHARDING: _on_sharding,
        TASK_STARTED: _on_task_started, SLOT_OFFER: _on_slot_offer,
        STARTED: _on_started, ERROR: _on_error, TASK_ERROR: _on_task_error, RESULT: _on_result,
        TIMELINE_LOCAL: _on_timeline_local, TIMELINE_CHUNK: _on_timeline_chunk,
        EPOCH_BEGIN: _on_progress, PROGRESS: _on_progress, EPOCH_END: _on_progress, EXIT: _on_exit,
        LEAVING: _on_leaving, STEP_SPLIT: _on_step_split, LINK_PROBE: _on_link_probe,
        PREEMPT_CALLS: _on_preempt_calls,
    }

    @staticmethod
    def _progress(state: RankState, kind: str, event: dict[str, Any]) -> None:
        state.reports_epochs = True
        state.epoch = int(event.get("epoch") or state.epoch)
        state.epochs = event.get("epochs", state.epochs) or state.epochs
        state.steps = event.get("steps", state.steps) or state.steps
        if kind == EPOCH_BEGIN:
            state.step = 0
        elif kind == PROGRESS:
            state.step = int(event.get("step") or 0)
            state.metrics = event.get("metrics") or state.metrics
            state.samples_per_s = event.get("samples_per_s") or state.samples_per_s
        else:
            state.step = state.steps or state.step
            state.metrics = event.get("metrics") or state.metrics
            if event.get("samples") and event.get("duration"):
                state.samples_per_s = event["samples"] / event["duration"]

    def tick(self) -> None:
        """Let the views refresh (they throttle themselves)."""
        for view in self.views:
            view.on_tick(self)

    @property
    def all_exited(self) -> bool:
        return all(r.exited for r in self.ranks)

    @property
    def all_started(self) -> bool:
        return all(r.pid is not None or r.exited for r in self.ranks)

    @property
    def any_failed(self) -> bool:
        return any(r.failed for r in self.ranks)

    def shard_summary(self) -> list[dict[str, Any]]:
        """Per DataFrame: its name, rows per rank, bytes and seconds spent writing the shards and
        waiting for Spark's rows."""
        by_source: dict[int, dict[str, Any]] = {}
        for state in self.ranks:
            for shard in state.shards:
                entry = by_source.setdefault(shard["source"], {
                    "name": shard["name"], "rows_per_rank": [0] * self.size, "bytes": 0,
                    "write_s": 0.0, "wait_s": 0.0})
                entry["rows_per_rank"][state.rank] = shard["rows"]
                entry["bytes"] += shard["bytes"]
                entry["write_s"] = max(entry["write_s"], shard["write_s"])
                entry["wait_s"] = max(entry["wait_s"], shard.get("wait_s", 0.0))
        return [by_source[k] for k in sorted(by_source)]

    @property
    def peer_lost(self) -> bool:
        """Whether ranks may have lost a peer: an elastic job, or a rank has failed (their
        Horovod loops then print that a connection closed; the failure says it better)."""
        return self.elastic is not None or any(r.failed for r in self.ranks)

    def failures(self) -> list[RankFailure]:
        """Failed ranks, root causes first (a rank that lost its peer, or stopped on a
        preemption notice, comes after), then by time."""
        failed = [r for r in self.ranks if r.failed]
        failed.sort(key=lambda r: (r.peer_lost or r.stopped_on_notice, r.failed_at or 0.0))
        return [r.failure() for r in failed]

    def failed_count(self) -> str:
        """How many ranks failed, as a failed job's error says it first: ``"1 of 4 ranks failed
        (ranks 0, 2, 3 then stopped: they lost a peer)"``. A rank whose collectives failed only
        because another rank went away is not counted as failed (it was: "2 of 2 ranks failed"
        of a job in which one rank raised), unless no rank failed otherwise."""
        failed = [r for r in self.ranks if r.failed]
        after = [r.rank for r in failed if r.peer_lost]
        causes = len(failed) - len(after)
        if not after or not causes:
            return f"{len(failed)} of {self.size} {self.unit}s failed"
        them = "it" if len(after) == 1 else "they"
        return (f"{causes} of {self.size} {self.unit}s failed ({ranks_named(after, self.unit)} "
                f"then stopped: {them} lost a peer)")

    def timeline_so_far(self) -> Path | None:
        """A running job's trace as rank 0 has written it so far, copied beside its destination
        and made valid; ``None`` when rank 0 writes it on another host (it comes at the end)."""
        from hvd_magics.job.records.timeline import repair

        if self.timeline_dest is None or not self._timeline_local:
            return None
        source = Path(self._timeline_local)
        if not source.exists():
            return None
        copy = self.timeline_dest.with_name(self.timeline_dest.stem + ".so-far.json")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)
        repair(copy)
        return copy

    def finish_timeline(self) -> Path | None:
        """Close the trace sent by rank 0; if none came (the job was stopped) but rank 0 wrote it
        on this host, copy it. Then make it valid JSON. Return its path, or ``None``."""
        from hvd_magics.job.records.timeline import repair

        if self.timeline_dest is None:
            return None
        if self._timeline_file is not None:
            self._timeline_file.close()
        elif self._timeline_local and Path(self._timeline_local).exists():
            self.timeline_dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self._timeline_local, self.timeline_dest)
            Path(self._timeline_local).unlink()
        else:
            return None
        repair(self.timeline_dest)
        return self.timeline_dest

    def settle(self, outcome: str) -> None:
        """Record how the job ended (``"succeeded"``, ``"failed"``, ``"interrupted"``,
        ``"preempted"``), and give
        the ranks that had not finished their last state, so the views agree with the record."""
        self.outcome = outcome
        if outcome not in (INTERRUPTED, "failed"):
            return
        for state in self.ranks:
            own_failure = state.error is not None or state.task_error or state.lost
            if state.state in (DONE, WAITING, READY) or own_failure or (
                    state.failed and outcome != INTERRUPTED):
                continue  # its own end says more (a rank killed by an interrupt was stopped)
            state.state = INTERRUPTED if outcome == INTERRUPTED else STOPPED

    def end(self) -> None:
        """Tell the views the job is over and close the log."""
        for view in self.views:
            view.on_end(self)
        self._log.close()
