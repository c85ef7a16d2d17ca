"""The driver's picture of a running job, built only from events; it also writes the full log."""
from __future__ import annotations

import base64
import collections
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import cloudpickle

from hvd_magics.epoch_timing import EPOCH_LINE, EpochTimer
from hvd_magics.errors import OUTPUT_TAIL_LINES, RankFailure

#: Error texts of a rank that failed only because a peer went away (not the root cause).
_PEER_LOST = ("HorovodInternalError", "Horovod has been shut down", "Connection reset by peer",
              "Connection closed by peer")

#: Rank states, in the order a healthy rank goes through them.
WAITING, STARTING, RUNNING, DONE, FAILED = "waiting", "starting", "running", "done", "failed"


class JobView(Protocol):
    """Something that shows a job to the user (text printer, widgets)."""

    def on_event(self, job: "JobState", event: dict[str, Any]) -> None: ...

    def on_tick(self, job: "JobState") -> None: ...

    def on_end(self, job: "JobState") -> None: ...


@dataclass
class RankState:
    """What the driver knows of one rank."""

    rank: int
    host: str = ""
    state: str = WAITING
    pid: int | None = None
    exit_code: int | None = None
    error: dict[str, Any] | None = None
    task_error: str = ""
    has_result: bool = False
    failed_at: float | None = None
    epoch: int = 0
    epochs: int | None = None
    step: int = 0
    steps: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    samples_per_s: float | None = None
    reports_epochs: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    tail: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=OUTPUT_TAIL_LINES))

    @property
    def exited(self) -> bool:
        return self.exit_code is not None or bool(self.task_error)

    @property
    def failed(self) -> bool:
        if self.error is not None or self.task_error:
            return True
        return self.exit_code is not None and (self.exit_code != 0 or not self.has_result)

    @property
    def peer_lost(self) -> bool:
        """Whether this rank only failed because another rank went away first."""
        err = self.error or {}
        text = f"{err.get('error', '')} {err.get('message', '')}"
        return any(marker in text for marker in _PEER_LOST)

    def failure(self) -> RankFailure:
        err = self.error or {}
        return RankFailure(self.rank, self.host, self.exit_code, err.get("error", ""),
                           err.get("message", ""), err.get("traceback", "") or self.task_error,
                           list(self.tail))


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
    """

    def __init__(self, size: int, log_path: Path, views: list[JobView] | None = None,
                 where: str = "") -> None:
        self.size = size
        self.where = where
        self.ranks = [RankState(r) for r in range(size)]
        self.views = list(views or [])
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in end()
        self.value_blob: str | None = None
        self.started_at = time.monotonic()
        self.timer = EpochTimer(self.started_at)
        self.timeline_dest: Path | None = None
        self._timeline_file: Any = None
        self._timeline_local: str | None = None

    def handle(self, event: dict[str, Any]) -> None:
        """Apply one event."""
        rank = event.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < self.size:
            return
        state = self.ranks[rank]
        event.setdefault("recv", time.monotonic())
        state.last_seen = event["recv"]
        self.timer.observe(event)
        state.host = event.get("host", state.host) or state.host
        kind = event["kind"]
        if kind == "output":
            stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", time.time())))
            for line in event.get("lines", []):
                state.tail.append(line)
                self._log.write(f"{stamp} [{rank}@{state.host}] {line}\n")
                match = EPOCH_LINE.match(line)
                if match and not state.reports_epochs:
                    state.epoch, state.epochs = int(match.group(1)), int(match.group(2))
        elif kind == "task_started":
            state.state = STARTING
        elif kind == "started":
            state.state = RUNNING
            state.pid = event.get("pid")
        elif kind == "error":
            state.error = event
            state.state = FAILED
        elif kind == "task_error":
            state.task_error = event.get("traceback", "")
            state.state = FAILED
        elif kind == "result":
            state.has_result = True
            if rank == 0:
                self.value_blob = event.get("value")
        elif kind == "timeline_local":
            self._timeline_local = event.get("path")
        elif kind == "timeline_chunk" and self.timeline_dest is not None:
            if self._timeline_file is None:
                self.timeline_dest.parent.mkdir(parents=True, exist_ok=True)
                self._timeline_file = open(self.timeline_dest, "wb")  # noqa: SIM115
            self._timeline_file.write(base64.b64decode(event["data"]))
        elif kind in ("epoch_begin", "progress", "epoch_end"):
            self._progress(state, kind, event)
        elif kind == "exit":
            state.exit_code = event.get("code")
            state.state = FAILED if state.failed else DONE
        if state.failed_at is None and state.failed:
            state.failed_at = state.last_seen
        for view in self.views:
            view.on_event(self, event)

    @staticmethod
    def _progress(state: RankState, kind: str, event: dict[str, Any]) -> None:
        state.reports_epochs = True
        state.epoch = int(event.get("epoch") or state.epoch)
        state.epochs = event.get("epochs", state.epochs) or state.epochs
        state.steps = event.get("steps", state.steps) or state.steps
        if kind == "epoch_begin":
            state.step = 0
        elif kind == "progress":
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

    def decode_value(self) -> Any:
        """Rank 0's return value (the line was verified by the channel before it got here)."""
        if self.value_blob is None:
            return None
        return cloudpickle.loads(base64.b64decode(self.value_blob))

    @property
    def all_exited(self) -> bool:
        return all(r.exited for r in self.ranks)

    @property
    def all_started(self) -> bool:
        return all(r.pid is not None or r.exited for r in self.ranks)

    @property
    def any_failed(self) -> bool:
        return any(r.failed for r in self.ranks)

    def failures(self) -> list[RankFailure]:
        """Failed ranks, root causes first (a rank that lost its peer comes after), then by time."""
        failed = [r for r in self.ranks if r.failed]
        failed.sort(key=lambda r: (r.peer_lost, r.failed_at or 0.0))
        return [r.failure() for r in failed]

    def finish_timeline(self) -> Path | None:
        """Close the trace sent by rank 0; if none came (the job was stopped) but rank 0 wrote it
        on this host, copy it. Then make it valid JSON. Return its path, or ``None``."""
        from hvd_magics.timeline import repair

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

    def end(self) -> None:
        """Tell the views the job is over and close the log."""
        for view in self.views:
            view.on_end(self)
        self._log.close()
