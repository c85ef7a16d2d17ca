"""The ranks' output on the driver: every line appended to the job's log file, stamped with
its rank and host; the lines the cell shows sorted from the rest (start-up chatter, bars, copies
of warnings: :mod:`hvd_magics.job.readings.output_lines`); each rank's tail kept for its error."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Final

from hvd_magics.events import OutputEvent, RunLogEvent
from hvd_magics.job.readings.output_lines import BAR, NOISE, SHOW, WARNING, OutputSorter
from hvd_magics.job.rank_state import RankState, display_line
from hvd_magics.job.records.epoch_timing import EPOCH_LINE
from hvd_magics.job.records.job_log import JobLog

#: Keys an ``output`` event gains once applied: its lines the cell shows (start-up chatter, bars,
#: copies of warnings and of other ranks' lines left out; a warning as one short line), and its
#: lines that are the rank's own output (chatter and bars left out).
SHOWN: Final = "shown"
KEPT: Final = "kept"


def _stamp(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


class RankOutput:
    """The output of a job of ``size`` ranks, logged in ``log_path``."""

    def __init__(self, size: int, log_path: Path) -> None:
        #: Sorts the ranks' output lines for the cell.
        self.sorter = OutputSorter(size)
        self._log = JobLog(log_path)

    def lines(self, state: RankState, event: OutputEvent, peer_lost: bool) -> None:
        """A rank's output lines: logged, sorted (``peer_lost``: a rank failed, so that the
        others' lost-connection chatter is noise), its tail kept; the event gains
        :data:`SHOWN` and :data:`KEPT`."""
        stamp = _stamp(event.get("time", time.time()))
        state.partial = ""
        shown, kept = [], []
        for line in event.get("lines", []):
            self._log.write(f"{stamp} [{state.rank}@{state.host}] {line}\n")
            sort, text = self.sorter.sort(state.rank, line, peer_lost)
            if sort == BAR:
                state.bar(text)
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

    def log_lines(self, state: RankState, event: RunLogEvent) -> None:
        """Lines for the log file only (a library's own log)."""
        stamp = _stamp(event.get("time", time.time()))
        for line in event.get("lines", []):
            self._log.write(f"{stamp} [{state.rank}@{state.host}] {line}\n")

    def driver_line(self, at: float, text: str) -> None:
        """The driver's own word, for the log file only."""
        self._log.write(f"{_stamp(at)} [driver] {text}\n")

    def note(self, state: RankState, text: str) -> None:
        """A line of the driver's about a rank, logged as the rank's."""
        self._log.write(f"{_stamp(time.time())} [{state.rank}@{state.host}] {text}\n")

    def close(self) -> None:
        self._log.close()
