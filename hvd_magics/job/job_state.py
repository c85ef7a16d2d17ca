"""The driver's picture of a running job, built only from events; it also writes the full log."""
from __future__ import annotations

import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from hvd_magics.job.readings.metric_history import MetricHistory
from hvd_magics.job.records.epoch_timing import EpochTimer
from hvd_magics.errors import RankFailure
from hvd_magics.options import STALL_AFTER_S, ElasticSize
from hvd_magics.job.readings.stacks import where as stack_where
from hvd_magics.job.readings.preemption import PreemptionWatch
from hvd_magics.job.verdicts.straggler import StepSplits
from hvd_magics.protocol import (DRIVER_LOG, EPOCH_BEGIN, EPOCH_END, LINK_PROBE, OUTPUT,
                                 OUTPUT_PARTIAL, PREEMPT_CALLS, PROGRESS, RESIZE, RESULT, RUN_LOG,
                                 SHARDING, SLOT_OFFER, STACKS, STEP_SPLIT, TIMELINE_CHUNK,
                                 TIMELINE_LOCAL)
from hvd_magics.events import (LinkProbeEvent, OutputEvent, OutputPartialEvent, PreemptCallsEvent,
                               ResultEvent, RunLogEvent, ShardingEvent, SlotOfferEvent,
                               TimelineChunkEvent, TimelineLocalEvent)
from hvd_magics.job.rank_output import RankOutput
from hvd_magics.job.rank_state import (READY, SHARDING_DATA,
                                       STALL_REQUEST, RankState,
                                       failed_count, failures)
from hvd_magics.job.readings.formations import Formations
from hvd_magics.job.readings.stacks import StackRequests
from hvd_magics.job.records.timeline_receiver import TimelineReceiver
from hvd_magics.rank_names import ranks_named, unit_of
from hvd_magics.job.readings.output_lines import plain


class JobView(Protocol):
    """Something that shows a job to the user (text printer, widgets)."""

    def on_event(self, job: JobState, event: dict[str, Any]) -> None: ...

    def on_tick(self, job: JobState) -> None: ...

    def on_end(self, job: JobState) -> None: ...


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
        #: Every formation of an elastic job's ranks (the first is its start).
        self.formations = Formations()
        self.views = list(views or [])
        #: The ranks' output: every line in the log, the cell's sorted
        #: (:mod:`hvd_magics.job.rank_output`).
        self.output = RankOutput(size, log_path)  # its log closed in end()
        self.log_path = log_path
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
        #: Rank 0's Horovod Timeline, when the job records one.
        self.timeline = TimelineReceiver(timeline_dest)
        #: How the job ended as a whole (``"succeeded"``, ``"failed"``, ``"interrupted"``,
        #: ``"preempted"``), set
        #: before :meth:`end`: an elastic job that lost ranks on the way may still succeed.
        self.outcome: str | None = None
        #: When the first Spark task began receiving the job's DataFrame rows.
        self.data_arrived_at: float | None = None
        #: Whether the job's rows were refused before any rank got the job (the views then
        #: leave nothing in the cell but the error).
        self.refused = False
        #: The ranks' stacks, asked for and answered.
        self.stacks = StackRequests()
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
            self.output.driver_line(event.get("time", time.time()), event.get("text", ""))
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
        else:
            state.apply(event)  # a rank's own way to its end
        if state.failed_at is None and state.failed:
            state.failed_at = state.last_seen
        for view in self.views:
            view.on_event(self, event)

    def _on_output(self, state: RankState, event: OutputEvent) -> None:
        self.output.lines(state, event, self.peer_lost)

    def _on_run_log(self, state: RankState, event: RunLogEvent) -> None:
        self.output.log_lines(state, event)

    def _on_output_partial(self, state: RankState, event: OutputPartialEvent) -> None:
        state.bar(plain(event.get("text", "")))

    def lose_host(self, host: str, ranks: list[int], silent_s: float) -> str:
        """The supervisors of ``host``'s ``ranks`` have been silent for ``silent_s`` seconds
        while other hosts' answered: its link or machine was lost. Each of its ranks is lost
        (the first failures, before the survivors' consequences); return the verdict."""
        text = (f"host {host} ({ranks_named(ranks, self.unit)}) stopped answering "
                f"{silent_s:.0f} s ago: its link or machine was lost")
        now = time.monotonic()
        for rank in ranks:
            self.ranks[rank].lose(text, now, host_lost=True)
        self.lost_host = text
        return text

    def _on_resize(self, event: dict[str, Any]) -> None:
        ranks = self.formations.add(event)
        for state in self.ranks:
            state.hvd_rank = ranks.get(state.rank)

    @property
    def resets(self) -> list[dict[str, Any]]:
        """The re-formings of an elastic job (its formations after the first)."""
        return self.formations.resets

    @property
    def current_size(self) -> int:
        """How many ranks the job has now (an elastic job's latest formation)."""
        return self.formations.size(self.size)

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
            self.timeline.written_at(event.get("path"))

    def _on_timeline_chunk(self, state: RankState, event: TimelineChunkEvent) -> None:
        self.timeline.chunk(event["data"])

    def _on_progress(self, state: RankState, event: dict[str, Any]) -> None:
        state.progress(event["kind"], event)
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
        self.stacks.answer(state.rank, event)
        where = stack_where(event.get("threads", []))
        if (str(event.get("request")).startswith(STALL_REQUEST) and where != state.stalled_at
                and state.stalled_for(event["recv"], self.stall_after) is not None):
            state.stalled_at = where
            self.output.note(state, f"hvd_magics: silent for {self.stall_after:.0f} s, in "
                                    f"{state.stalled_at}")

    def running_ranks(self) -> list[int]:
        """Ranks whose process started and has not exited."""
        return [r.rank for r in self.ranks if not r.exited and r.pid is not None]

    def starting_ranks(self) -> list[int]:
        """Ranks whose process has not started yet."""
        return [r.rank for r in self.ranks if not r.exited and r.pid is None]

    def ended_on_notice(self) -> list[int]:
        """Ranks that ended on purpose at a preemption notice, their part of the save done."""
        return [r.rank for r in self.ranks if r.stopped_on_notice]

    def finished_ranks(self) -> list[int]:
        """Ranks whose code returned: leaving their engine, or ended with success (a pool's
        rank whose cell ended)."""
        return [r.rank for r in self.ranks if r.left or (r.exited and not r.failed)]

    #: Event kind -> how it changes the job (``log`` changes nothing here: views show it; a
    #: rank's own way to its end is :meth:`RankState.apply`'s); each handler reads its kind's
    #: record (hvd_magics.events).
    _HANDLERS: ClassVar[dict[str, Callable[[JobState, RankState, Any], None]]] = {
        OUTPUT: _on_output, OUTPUT_PARTIAL: _on_output_partial, RUN_LOG: _on_run_log,
        SHARDING: _on_sharding, SLOT_OFFER: _on_slot_offer, RESULT: _on_result,
        TIMELINE_LOCAL: _on_timeline_local, TIMELINE_CHUNK: _on_timeline_chunk,
        EPOCH_BEGIN: _on_progress, PROGRESS: _on_progress, EPOCH_END: _on_progress,
        STEP_SPLIT: _on_step_split, LINK_PROBE: _on_link_probe, PREEMPT_CALLS: _on_preempt_calls,
    }

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

    @property
    def peer_lost(self) -> bool:
        """Whether ranks may have lost a peer: an elastic job, or a rank has failed (their
        Horovod loops then print that a connection closed; the failure says it better)."""
        return self.elastic is not None or any(r.failed for r in self.ranks)

    def failures(self) -> list[RankFailure]:
        """Failed ranks, root causes first (:func:`hvd_magics.job.rank_state.failures`)."""
        return failures(self.ranks)

    def failed_count(self) -> str:
        """How many ranks failed (:func:`hvd_magics.job.rank_state.failed_count`)."""
        return failed_count(self.ranks, self.unit)

    def settle(self, outcome: str) -> None:
        """Record how the job ended (``"succeeded"``, ``"failed"``, ``"interrupted"``,
        ``"preempted"``), and give
        the ranks that had not finished their last state, so the views agree with the record."""
        self.outcome = outcome
        for state in self.ranks:
            state.settle(outcome)

    def end(self) -> None:
        """Tell the views the job is over and close the log."""
        for view in self.views:
            view.on_end(self)
        self.output.close()
