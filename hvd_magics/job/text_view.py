"""Show a running job as plain text: each rank's lines with a rank prefix.

What it shows: the ranks' output (without framework start-up chatter, see :mod:`hvd_magics.job.noise`),
progress bars drawn with carriage returns redrawn in place, a line when a rank stalls, and, when
ranks print faster than a person reads, the first and the last lines of each burst with a count of
what was left out. Every line is always in the job's log file.
"""
from __future__ import annotations

import collections
import sys
import time
from typing import IO, Any

from hvd_magics.job.job_state import JobState, display_line
from hvd_magics.job.noise import is_noise
from hvd_magics.job.options import (VERBOSITY_ALL, VERBOSITY_DEBUG, VERBOSITY_LOG_CALLBACK_ONLY,
                                    validate_verbosity)
from hvd_magics.protocol import EPOCH_END, LOG, OUTPUT, OUTPUT_PARTIAL, RESIZE

#: Lines are written at most this often...
FLUSH_INTERVAL_S = 0.1
#: ...and at most this many at a time: the first half and the last half of what came; the rest
#: are counted (every line is in the log file).
MAX_LINES_PER_FLUSH = 1000


class TextView:
    """Print rank output as it arrives: ``[rank] line``, or ``[rank@host] line`` across hosts.

    Parameters
    ----------
    verbosity : str
        ``"all"`` prints every line of every rank but framework start-up chatter; ``"debug"``
        prints that too; ``"log_callback_only"`` prints only what ranks send with
        :func:`hvd_magics.log_to_driver` (everything still reaches the log file).
    stream : file, optional
        Where to print (``sys.stdout`` at the time of each print by default).
    epoch_lines : bool
        Also print a line when a rank reports the end of an epoch (where no widgets show it).
    """

    def __init__(self, verbosity: str = VERBOSITY_ALL, stream: IO[str] | None = None,
                 epoch_lines: bool = False) -> None:
        self.verbosity = validate_verbosity(verbosity)
        self.epoch_lines = epoch_lines
        self._stream = stream
        self._head: list[tuple[int, str]] = []
        self._tail: collections.deque[tuple[int, str]] = collections.deque(
            maxlen=MAX_LINES_PER_FLUSH // 2)
        self._dropped = 0
        self._flushed = 0.0
        self._partials_changed = False  # a rank's unfinished line (JobState keeps it) moved
        self._open_rank: int | None = None  # whose progress bar is on screen, unfinished
        self._open_len = 0
        self._stalled: dict[int, float] = {}

    def _prefix(self, job: JobState, rank: int) -> str:
        hosts = {r.host for r in job.ranks if r.host}
        who = f"task{rank}" if job.elastic else str(rank)
        return f"[{who}@{job.ranks[rank].host}]" if len(hosts) > 1 else f"[{who}]"

    def _lines_of(self, job: JobState, event: dict[str, Any]) -> list[str]:
        kind = event["kind"]
        if kind == OUTPUT and self.verbosity != VERBOSITY_LOG_CALLBACK_ONLY:
            lines = event.get("lines", [])
            return lines if self.verbosity == VERBOSITY_DEBUG else [
                ln for ln in lines if not is_noise(ln, job.elastic is not None)]
        if kind == LOG:
            return [event.get("text", "")]
        if kind == EPOCH_END and self.epoch_lines:
            return [_epoch_line(event)]
        return []

    def on_event(self, job: JobState, event: dict[str, Any]) -> None:
        rank, kind = event["rank"], event["kind"]
        if kind == RESIZE:
            self._add(None, resize_line(event))
            return
        if kind == OUTPUT_PARTIAL and self.verbosity != VERBOSITY_LOG_CALLBACK_ONLY:
            self._partials_changed = True
            return
        for line in self._lines_of(job, event):
            self._add(rank, display_line(line))

    def _add(self, rank: int, line: str) -> None:
        if len(self._head) < MAX_LINES_PER_FLUSH // 2:
            self._head.append((rank, line))
            return
        if len(self._tail) == self._tail.maxlen:
            self._dropped += 1
        self._tail.append((rank, line))

    def on_tick(self, job: JobState) -> None:
        now = time.monotonic()
        self._check_stalls(job, now)
        if now - self._flushed >= FLUSH_INTERVAL_S:
            self._flush(job)

    def _check_stalls(self, job: JobState, now: float) -> None:
        for rank in job.ranks:
            silent = rank.stalled_for(now)
            if silent is not None and rank.rank not in self._stalled:
                self._stalled[rank.rank] = rank.last_seen
                self._add(rank.rank, f"no output or progress for {silent:.0f} s: stalled? (it "
                                     "still runs; interrupt the kernel to stop the job)")
            elif silent is None and rank.rank in self._stalled:
                quiet = rank.last_seen - self._stalled.pop(rank.rank)
                self._add(rank.rank, f"active again after {quiet:.0f} s")

    def _flush(self, job: JobState) -> None:
        self._flushed = time.monotonic()
        out: list[str] = []
        for rank, line in self._head:
            out.append(self._complete(job, rank, line))
        if self._dropped:
            out.append(self._complete(job, None, f"... {self._dropped} more lines not shown here "
                                                  f"(all are in {job.log_path})"))
        for rank, line in self._tail:
            out.append(self._complete(job, rank, line))
        self._head, self._dropped = [], 0
        self._tail.clear()
        live = [r for r in job.ranks if r.partial]
        if self._partials_changed and live:
            rank = live[0].rank
            text = f"{self._prefix(job, rank)} {display_line(live[0].partial, 300)}"
            out.append("\r" + text.ljust(self._open_len))
            self._open_rank, self._open_len = rank, len(text)
        self._partials_changed = False
        if out:
            stream = self._stream or sys.stdout
            stream.write("".join(out))
            stream.flush()

    def _complete(self, job: JobState, rank: int | None, line: str) -> str:
        """One complete line; it replaces the progress bar of its own rank, if one is open."""
        text = line if rank is None else f"{self._prefix(job, rank)} {line}"
        lead = ""
        if self._open_rank is not None:
            lead = "\r" if rank == self._open_rank else "\n"
            text = text.ljust(self._open_len) if rank == self._open_rank else text
            self._open_rank, self._open_len = None, 0
        return f"{lead}{text}\n"

    def on_end(self, job: JobState) -> None:
        self._partials_changed = False  # a bar left unfinished is not redrawn at the end
        self._flush(job)
        if self._open_rank is not None:
            (self._stream or sys.stdout).write("\n")
            self._open_rank = None


def resize_line(event: dict[str, Any]) -> str:
    """What an elastic job's ``resize`` event says, as one line."""
    tasks = ", ".join(f"task {t} as rank {r}" for t, r in sorted(event["ranks"].items(),
                                                                  key=lambda item: item[1]))
    if not event.get("reset"):
        return f"hvd_magics: elastic job started with {_ranks(event['size'])} ({tasks})"
    causes = "; ".join(event.get("causes") or []) or "the ranks re-formed"
    return (f"hvd_magics: reset {event['reset']}: {causes}; training goes on with "
            f"{_ranks(event['size'])} ({tasks})")


def _ranks(count: int) -> str:
    return f"{count} rank" + ("" if count == 1 else "s")


def _epoch_line(event: dict[str, Any]) -> str:
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in (event.get("metrics") or {}).items())
    of = f"/{event['epochs']}" if event.get("epochs") else ""
    return (f"epoch {event.get('epoch')}{of} done in {float(event.get('duration') or 0):.2f} s"
            + (f": {metrics}" if metrics else ""))
