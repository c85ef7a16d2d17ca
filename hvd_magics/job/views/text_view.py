"""Show a running job as plain text: each rank's lines with a rank prefix.

What it shows: the ranks' output as :mod:`hvd_magics.job.readings.output_lines` sorts it (without
framework start-up chatter, each kind of warning once, a line other ranks repeat once), progress
bars (drawn with carriage returns or cursor codes) redrawn in place as one live line, a line
when a rank stalls, and, when ranks print faster than a person reads, the first and the last
lines of each burst with a count of what was left out. Every line is always in the job's log
file.
"""
from __future__ import annotations

import collections
import sys
import time
from typing import IO

from hvd_magics.events import EpochEndEvent, Event, ResizeEvent, Wire
from hvd_magics.job.job_state import JobState
from hvd_magics.job.rank_output import SHOWN
from hvd_magics.job.rank_state import display_line
from hvd_magics.job.readings.output_lines import FEW_RANKS, SHOW, OutputSorter
from hvd_magics.job.verdicts.straggler_verdict import Straggler
from hvd_magics.options import (VERBOSITY_ALL, VERBOSITY_DEBUG, VERBOSITY_LOG_CALLBACK_ONLY,
                                    validate_verbosity)
from hvd_magics.protocol import (EPOCH_END, FIRST_BUILD, LOG, OUTPUT, OUTPUT_PARTIAL, PROGRESS,
                                 RESIZE, STEP_SPLIT, is_event)
from hvd_magics.rank_names import TASK, line_tag, rank_named, ranks_named

#: Lines are written at most this often...
FLUSH_INTERVAL_S = 0.1
#: How long a stalled rank's line waits for the rank to say where it is.
STALL_WHERE_WAIT_S = 2.0
#: ...and at most this many at a time: the first half and the last half of what came (the last
#: half shared by the ranks that printed, so that each rank's last lines are always shown); the
#: rest are counted (every line is in the log file).
MAX_LINES_PER_FLUSH = 1000
#: Each rank's last lines shown after a flood, however many ranks printed.
MIN_TAIL_PER_RANK = 20


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
        self._head: list[tuple[int | None, str]] = []
        #: After the head is full: each rank's latest lines, numbered in arrival order.
        self._tails: dict[int | None, collections.deque[tuple[int, str]]] = {}
        self._dropped: collections.Counter[int | None] = collections.Counter()
        self._seq = 0
        self._flushed = 0.0
        self._partials_changed = False  # a rank's unfinished line (JobState keeps it) moved
        self._open_len = 0  # the ranks' unfinished lines are on screen as the last line
        self._erased = False  # that line was cleared for complete lines: draw it again
        self._stalled: dict[int, float] = {}
        #: Folds the ranks' epoch lines past a few ranks (made at the first).
        self._epoch_sorter: OutputSorter | None = None
        #: Straggler verdicts printed so far (JobState.splits.events).
        self._verdicts_said = 0
        self._links_said = False
        #: Stalled ranks not yet shown: when to show them even without their stacks.
        self._where_due: dict[int, float] = {}

    def _prefix(self, job: JobState, rank: int) -> str:
        hosts = {r.host for r in job.ranks if r.host}
        return line_tag(rank, job.unit, job.ranks[rank].host if len(hosts) > 1 else None)

    def _lines_of(self, job: JobState, rank: int, event: Event) -> list[str]:
        if event["kind"] == OUTPUT and self.verbosity != VERBOSITY_LOG_CALLBACK_ONLY:
            lines = event.get("lines", [])
            return lines if self.verbosity == VERBOSITY_DEBUG else event.get(SHOWN, lines)
        if event["kind"] == LOG:
            return [event.get("text", "")]
        if event["kind"] == EPOCH_END and self.epoch_lines:
            line = _epoch_line(event)
            if job.size <= FEW_RANKS:
                return [line]
            # past a few ranks, rank 0's line and one of what differs on the others
            self._epoch_sorter = self._epoch_sorter or OutputSorter(job.size)
            sort, text = self._epoch_sorter.sort(rank, line)
            return [text] if sort == SHOW else []
        return []

    def on_event(self, job: JobState, event: Wire) -> None:
        if is_event(event):
            self._show(job, event)

    def _show(self, job: JobState, event: Event) -> None:
        rank, kind = event.get("rank"), event["kind"]
        if event["kind"] == RESIZE:
            self._add(None, resize_line(event))
            return
        if rank is None:  # every rank's event names it (only the driver's own do not)
            return
        if kind == OUTPUT_PARTIAL and self.verbosity != VERBOSITY_LOG_CALLBACK_ONLY:
            self._partials_changed = True
            return
        if kind == PROGRESS and self._progress_lines():  # no dashboard: its live line says it
            self._partials_changed = True
        if kind == STEP_SPLIT and self.epoch_lines:  # no dashboard: its header says it
            for what, found in job.splits.events[self._verdicts_said:]:
                if what == "cleared" and isinstance(found, Straggler):  # (never BusyHosts)
                    said = (f"{ranks_named(list(found.ranks), job.unit)} caught up by step "
                            f"{found.step}: no {job.unit} holds the others back now")
                else:
                    said = found.text(job.unit)
                self._add(None, f"hvd_magics: {said}")
            self._verdicts_said = len(job.splits.events)
        for line in self._lines_of(job, rank, event):
            self._add(rank, display_line(line))

    def _progress_lines(self) -> bool:
        """Whether the ranks' steps are drawn as a live line: where no dashboard shows them,
        and the line is redrawn in place (a terminal, a notebook), not piled up in a file."""
        if not self.epoch_lines:
            return False
        stream = self._stream or sys.stdout
        isatty = getattr(stream, "isatty", lambda: False)
        return bool(isatty()) or "ipykernel" in sys.modules

    def _add(self, rank: int | None, line: str) -> None:
        if len(self._head) < MAX_LINES_PER_FLUSH // 2:
            self._head.append((rank, line))
            return
        tail = self._tails.setdefault(rank, collections.deque(maxlen=MAX_LINES_PER_FLUSH // 2))
        if len(tail) == tail.maxlen:
            self._dropped[rank] += 1
        self._seq += 1
        tail.append((self._seq, line))

    def _take_tails(self) -> list[tuple[int | None, str]]:
        """The last lines of every rank that printed past the head, in arrival order: the tail's
        room shared among them, at least :data:`MIN_TAIL_PER_RANK` each."""
        keep = max(MIN_TAIL_PER_RANK, (MAX_LINES_PER_FLUSH // 2) // max(len(self._tails), 1))
        lines = []
        for rank, tail in self._tails.items():
            self._dropped[rank] += max(len(tail) - keep, 0)
            lines += [(seq, rank, line) for seq, line in list(tail)[-keep:]]
        self._tails.clear()
        return [(rank, line) for _, rank, line in sorted(lines, key=lambda item: item[0])]

    def _dropped_note(self, job: JobState) -> str:
        total = sum(self._dropped.values())
        ranks = sorted(r for r in self._dropped if r is not None and self._dropped[r])
        each = ", ".join(f"{job.unit} {r}: {self._dropped[r]:,}" for r in ranks)
        return (f"... {total:,} more lines not shown here ({each}; all are in {job.log_path})"
                if len(ranks) > 1 else
                f"... {total:,} more lines not shown here (all are in {job.log_path})")

    def on_tick(self, job: JobState) -> None:
        now = time.monotonic()
        if job.links and not self._links_said and self.epoch_lines:  # no dashboard says it
            self._links_said = True
            self._add(None, f"hvd_magics: {job.links}")
        self._check_stalls(job, now)
        if now - self._flushed >= FLUSH_INTERVAL_S:
            self._flush(job)

    def _check_stalls(self, job: JobState, now: float) -> None:
        for rank in job.ranks:
            silent = rank.stalled_for(now, job.stall_after)
            if silent is not None and rank.rank not in self._stalled:
                self._stalled[rank.rank] = rank.last_seen
                self._where_due[rank.rank] = now + STALL_WHERE_WAIT_S
            due = self._where_due.get(rank.rank)
            if silent is not None and due is not None and (rank.stalled_at or now >= due):
                del self._where_due[rank.rank]  # said once, with where it is when known
                where = f", in {rank.stalled_at}" if rank.stalled_at else ""
                if rank.tail and rank.tail[-1].startswith(FIRST_BUILD):  # it said why
                    self._add(rank.rank, f"still building the PyTorch extension after "
                                         f"{silent:.0f} s (it says nothing until it is built)")
                    continue
                self._add(rank.rank, f"no output or progress for {silent:.0f} s{where}: stalled? "
                                     "(it still runs; interrupt the kernel to stop the job)")
            elif silent is None and rank.rank in self._stalled:
                self._where_due.pop(rank.rank, None)
                quiet = rank.last_seen - self._stalled.pop(rank.rank)
                self._add(rank.rank, f"active again after {quiet:.0f} s")

    def _flush(self, job: JobState) -> None:
        self._flushed = time.monotonic()
        out: list[str] = []
        for rank, line in self._head:
            out.append(self._complete(job, rank, line))
        tails = self._take_tails()
        if sum(self._dropped.values()):
            out.append(self._complete(job, None, self._dropped_note(job)))
        for rank, line in tails:
            out.append(self._complete(job, rank, line))
        self._head = []
        self._dropped.clear()
        steps = self._progress_lines()
        drawn = [(r.rank, r.partial or (steps and r.progress_line())) for r in job.ranks]
        live = [(rank, text) for rank, text in drawn if text]
        if (self._partials_changed or self._erased) and live:
            out.append(self._status_line(job, live))
        self._partials_changed = self._erased = False
        if out:
            stream = self._stream or sys.stdout
            stream.write("".join(out))
            stream.flush()

    def _status_line(self, job: JobState, live: list[tuple[int, str]]) -> str:
        """Every rank's live line (a progress bar it draws, or where its steps are when no
        dashboard shows them) on one line, drawn over the previous one."""
        if len(live) == 1:
            text = f"{self._prefix(job, live[0][0])} {display_line(live[0][1], 300)}"
        else:
            width = max(40, 300 // len(live))
            text = "  ".join(f"{self._prefix(job, rank)} {line[:width].strip()}"
                             for rank, line in live)
        line = "\r" + text.ljust(self._open_len)
        self._open_len = len(text)
        return line

    def _complete(self, job: JobState, rank: int | None, line: str) -> str:
        """One complete line, drawn over the ranks' progress bars if they are on screen (they
        are drawn again below it)."""
        text = line if rank is None else f"{self._prefix(job, rank)} {line}"
        lead = ""
        if self._open_len:
            lead, text = "\r", text.ljust(self._open_len)
            self._open_len, self._erased = 0, True
        return f"{lead}{text}\n"

    def on_end(self, job: JobState) -> None:
        self._partials_changed = False  # a bar left unfinished is not redrawn at the end
        left_out = job.output.sorter.left_out(job.log_path)
        if left_out and self.verbosity == VERBOSITY_ALL:
            self._add(None, left_out)
        self._flush(job)
        self._erased = False
        if self._open_len:
            (self._stream or sys.stdout).write("\n")
            self._open_len = 0


def resize_line(event: ResizeEvent) -> str:
    """What an elastic job's ``resize`` event says, as one line."""
    tasks = ", ".join(f"{rank_named(t, TASK)} as {rank_named(r)}"
                      for t, r in sorted(event["ranks"].items(), key=lambda item: item[1]))
    if not event.get("reset"):
        return f"hvd_magics: elastic job started with {_ranks(event['size'])} ({tasks})"
    causes = "; ".join(event.get("causes") or []) or "the ranks re-formed"
    return (f"hvd_magics: reset {event['reset']}: {causes}; training goes on with "
            f"{_ranks(event['size'])} ({tasks})")


def _ranks(count: int) -> str:
    return f"{count} rank" + ("" if count == 1 else "s")


def _epoch_line(event: EpochEndEvent) -> str:
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in (event.get("metrics") or {}).items())
    of = f"/{event['epochs']}" if event.get("epochs") else ""
    return (f"epoch {event.get('epoch')}{of} done in {float(event.get('duration') or 0):.2f} s"
            + (f": {metrics}" if metrics else ""))
