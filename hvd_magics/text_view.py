"""Show a running job as plain text: each rank's lines with a rank prefix."""
from __future__ import annotations

import sys
import time
from typing import IO, Any

from hvd_magics.job_state import JobState

#: ``driver_log_verbosity`` values, with HorovodRunner's meaning.
VERBOSITY_ALL = "all"
VERBOSITY_LOG_CALLBACK_ONLY = "log_callback_only"
VERBOSITIES = (VERBOSITY_ALL, VERBOSITY_LOG_CALLBACK_ONLY)
#: Lines are written at most this often...
FLUSH_INTERVAL_S = 0.1
#: ...and at most this many at a time; the rest are counted (every line is in the log file).
MAX_LINES_PER_FLUSH = 1000


class TextView:
    """Print rank output as it arrives: ``[rank] line``, or ``[rank@host] line`` across hosts.

    Parameters
    ----------
    verbosity : str
        ``"all"`` prints every line of every rank; ``"log_callback_only"`` prints only what
        ranks send with :func:`hvd_magics.log_to_driver` (everything still reaches the log file).
    stream : file, optional
        Where to print (``sys.stdout`` at the time of each print by default).
    epoch_lines : bool
        Also print a line when a rank reports the end of an epoch (where no widgets show it).
    """

    def __init__(self, verbosity: str = VERBOSITY_ALL, stream: IO[str] | None = None,
                 epoch_lines: bool = False) -> None:
        if verbosity not in VERBOSITIES:
            raise ValueError(f"driver_log_verbosity must be one of {VERBOSITIES}, got {verbosity!r}")
        self.verbosity = verbosity
        self.epoch_lines = epoch_lines
        self._stream = stream
        self._pending: list[str] = []
        self._dropped = 0
        self._flushed = 0.0

    def _prefix(self, job: JobState, rank: int) -> str:
        hosts = {r.host for r in job.ranks if r.host}
        return f"[{rank}@{job.ranks[rank].host}]" if len(hosts) > 1 else f"[{rank}]"

    def on_event(self, job: JobState, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "output" and self.verbosity == VERBOSITY_ALL:
            lines = event.get("lines", [])
        elif kind == "log":
            lines = [event.get("text", "")]
        elif kind == "epoch_end" and self.epoch_lines:
            lines = [_epoch_line(event)]
        else:
            return
        prefix = self._prefix(job, event["rank"])
        room = MAX_LINES_PER_FLUSH - len(self._pending)
        self._pending += [f"{prefix} {line}\n" for line in lines[:max(room, 0)]]
        self._dropped += max(len(lines) - max(room, 0), 0)

    def on_tick(self, job: JobState) -> None:
        if time.monotonic() - self._flushed >= FLUSH_INTERVAL_S:
            self._flush(job)

    def _flush(self, job: JobState) -> None:
        self._flushed = time.monotonic()
        if self._dropped:
            self._pending.append(f"... {self._dropped} more lines not shown here (all are in "
                                 f"{job.log_path})\n")
            self._dropped = 0
        if self._pending:
            stream = self._stream or sys.stdout
            stream.write("".join(self._pending))
            stream.flush()
            self._pending = []

    def on_end(self, job: JobState) -> None:
        self._flush(job)


def _epoch_line(event: dict[str, Any]) -> str:
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in (event.get("metrics") or {}).items())
    of = f"/{event['epochs']}" if event.get("epochs") else ""
    return (f"epoch {event.get('epoch')}{of} done in {float(event.get('duration') or 0):.2f} s"
            + (f": {metrics}" if metrics else ""))
