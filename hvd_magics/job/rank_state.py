"""What the driver knows of one rank, built from its events: its state on the way to its end,
its failure and why (:mod:`hvd_magics.causes`), where it is in its epochs; and what the job's
error says of its failed ranks."""
from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hvd_magics.causes import RANK_LOST, RankCause, rank_cause
from hvd_magics.errors import OUTPUT_TAIL_LINES, RankFailure
from hvd_magics.events import (ChannelClosedEvent, ErrorEvent, ExitEvent, LeavingEvent,
                               ShardReport, StartedEvent, TaskErrorEvent, TaskStartedEvent, Wire,
                               to_wire)
from hvd_magics.job.readings.output_lines import bar_count
from hvd_magics.options import STALL_AFTER_S
from hvd_magics.protocol import (CHANNEL_CLOSED, EPOCH_BEGIN, ERROR, EXIT, LEAVING, PROGRESS,
                                 STARTED, TASK_ERROR, TASK_STARTED)
from hvd_magics.rank_names import TASK, ranks_named

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
#: Error name of a rank whose supervisor vanished (its Spark executor was lost or killed).
LOST = RANK_LOST


def display_line(line: str, limit: int = DISPLAY_LINE_CHARS) -> str:
    """``line`` cut to ``limit`` characters for display, saying how long it was."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]} ... [{len(line):,} characters; the whole line is in the log file]"


#: How the C++ runtime says an uncaught exception ended a process (then SIGABRT): its type, and
#: on the next line its ``what()``. Horovod's and Gloo's native errors end a rank this way.
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s*(.*)$")
#: The ``[file.cc:54]`` places Gloo puts in front of its messages.
_SOURCE_PLACES = re.compile(r"^(\[[^\]]*:\d+\]\s*)+")


def native_exception(lines: Any) -> dict[str, str]:
    """The C++ exception that aborted a rank, as its last output lines say it: ``{"error":
    "gloo::IoException", "message": "Wait timeout after 30 seconds for key(s): 0. ..."}``, or
    ``{}`` when they say none (a rank killed by signal 6 said only that)."""
    lines = list(lines)
    for index in range(len(lines) - 1, -1, -1):
        found = _TERMINATE.search(str(lines[index]))
        if found:
            what = _WHAT.match(str(lines[index + 1])) if index + 1 < len(lines) else None
            message = _SOURCE_PLACES.sub("", what.group(1)).strip() if what else ""
            return {"error": found.group(1), "message": message}
    return {}


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

    def lose(self, why: str, now: float | None = None, host_lost: bool = False) -> None:
        """It was lost (``why``): its executor, or its host (``host_lost``); nothing changes
        once it exited."""
        if self.exited:
            return
        self.lost, self.state, self.host_lost = why, FAILED, host_lost
        if now is not None:
            self.failed_at = now

    def settle(self, outcome: str) -> None:
        """Its last state once its job ended (``outcome``: ``"failed"``, ``"interrupted"``...)
        without it having finished, so that the views agree with the record."""
        if outcome not in (INTERRUPTED, "failed"):
            return
        own_failure = self.error is not None or self.task_error or self.lost
        if self.state in (DONE, WAITING, READY) or own_failure or (
                self.failed and outcome != INTERRUPTED):
            return  # its own end says more (a rank killed by an interrupt was stopped)
        self.state = INTERRUPTED if outcome == INTERRUPTED else STOPPED

    def apply(self, event: Wire) -> None:
        """Take one of its own events on its way to its end (others change nothing here)."""
        handler = _OWN_EVENTS.get(str(event.get("kind")))
        if handler is not None:
            handler(self, event)

    def _on_channel_closed(self, event: ChannelClosedEvent) -> None:
        if not event.get("clean") and not self.exited:
            where = f" on {self.host}" if self.host else ""
            task = (f"Spark task {self.rank}" if self.unit == TASK else
                    f"the Spark task of rank {self.rank}")
            self.lose(f"{task}{where} ended without a word: its executor was lost or killed")

    def _on_task_started(self, event: TaskStartedEvent) -> None:
        self.state = STARTING
        self.shards = list(event.get("shards") or [])
        self.task = event.get("task")

    def _on_started(self, event: StartedEvent) -> None:
        self.state = RUNNING
        self.pid = event.get("pid")

    def _on_error(self, event: ErrorEvent) -> None:
        self.error = to_wire(event)
        self.state = self.failed_state

    def _on_task_error(self, event: TaskErrorEvent) -> None:
        self.task_error = event.get("traceback", "")
        self.state = FAILED

    def _on_leaving(self, event: LeavingEvent) -> None:
        self.left = True
        self.ddp_steps = event.get("steps")

    def _on_exit(self, event: ExitEvent) -> None:
        self.exit_code = event.get("code")
        self.exit_how = str(event.get("how") or "")
        self.state = self.failed_state if self.failed else DONE

    def failure(self) -> RankFailure:
        err = self.error or ({"error": LOST, "message": self.lost} if self.lost else {})
        native = {} if err else native_exception(self.tail)
        err = err or native
        tail = [line for line in self.tail  # the lines the native error was read from: said once
                if not (native and (_TERMINATE.search(str(line)) or _WHAT.match(str(line))))]
        return RankFailure(self.rank, self.host, self.exit_code, err.get("error", ""),
                           err.get("message", ""), err.get("traceback", "") or self.task_error,
                           tail, self.unit, self.exit_how, self.host_lost, bool(native))

    def bar(self, text: str) -> None:
        """A rank's live line (a bar); its count moves the rank's steps when the rank reports
        none itself."""
        self.partial = display_line(text)
        count = bar_count(text)
        if count is not None and not self.reports_epochs:
            self.step, self.steps = count

    def progress(self, kind: str, event: dict[str, Any]) -> None:
        """Where it is in its epochs, as an ``epoch_begin``, ``progress`` or ``epoch_end``
        event says."""
        self.reports_epochs = True
        self.epoch = int(event.get("epoch") or self.epoch)
        self.epochs = event.get("epochs", self.epochs) or self.epochs
        self.steps = event.get("steps", self.steps) or self.steps
        if kind == EPOCH_BEGIN:
            self.step = 0
        elif kind == PROGRESS:
            self.step = int(event.get("step") or 0)
            self.metrics = event.get("metrics") or self.metrics
            self.samples_per_s = event.get("samples_per_s") or self.samples_per_s
        else:
            self.step = self.steps or self.step
            self.metrics = event.get("metrics") or self.metrics
            if event.get("samples") and event.get("duration"):
                self.samples_per_s = event["samples"] / event["duration"]


def failures(ranks: list[RankState]) -> list[RankFailure]:
    """Failed ranks, root causes first (a rank that lost its peer, or stopped on a
    preemption notice, comes after), then by time."""
    failed = [r for r in ranks if r.failed]
    failed.sort(key=lambda r: (r.peer_lost or r.stopped_on_notice, r.failed_at or 0.0))
    return [r.failure() for r in failed]


def failed_count(ranks: list[RankState], unit: str) -> str:
    """How many ranks failed, as a failed job's error says it first: ``"1 of 4 ranks failed
    (ranks 0, 2, 3 then stopped: they lost a peer)"``. A rank whose collectives failed only
    because another rank went away is not counted as failed (it was: "2 of 2 ranks failed"
    of a job in which one rank raised), unless no rank failed otherwise."""
    failed = [r for r in ranks if r.failed]
    after = [r.rank for r in failed if r.peer_lost]
    causes = len(failed) - len(after)
    if not after or not causes:
        return f"{len(failed)} of {len(ranks)} {unit}s failed"
    them = "it" if len(after) == 1 else "they"
    return (f"{causes} of {len(ranks)} {unit}s failed ({ranks_named(after, unit)} "
            f"then stopped: {them} lost a peer)")


def shard_summary(ranks: list[RankState]) -> list[dict[str, Any]]:
    """Per DataFrame: its name, rows per rank, bytes and seconds spent writing the shards and
    waiting for Spark's rows."""
    by_source: dict[int, dict[str, Any]] = {}
    for state in ranks:
        for shard in state.shards:
            entry = by_source.setdefault(shard["source"], {
                "name": shard["name"], "rows_per_rank": [0] * len(ranks), "bytes": 0,
                "write_s": 0.0, "wait_s": 0.0})
            entry["rows_per_rank"][state.rank] = shard["rows"]
            entry["bytes"] += shard["bytes"]
            entry["write_s"] = max(entry["write_s"], shard["write_s"])
            entry["wait_s"] = max(entry["wait_s"], shard.get("wait_s", 0.0))
    return [by_source[k] for k in sorted(by_source)]


#: A rank's own events on its way to its end -> how each changes it.
_OWN_EVENTS: dict[str, Callable[[RankState, Any], None]] = {
    CHANNEL_CLOSED: RankState._on_channel_closed, TASK_STARTED: RankState._on_task_started,
    STARTED: RankState._on_started, ERROR: RankState._on_error,
    TASK_ERROR: RankState._on_task_error, LEAVING: RankState._on_leaving,
    EXIT: RankState._on_exit,
}
