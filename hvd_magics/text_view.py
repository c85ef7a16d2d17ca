"""Show a running job as plain text: each rank's lines with a rank prefix."""
from __future__ import annotations

import sys
from typing import IO, Any

from hvd_magics.job_state import JobState

#: ``driver_log_verbosity`` values, with HorovodRunner's meaning.
VERBOSITY_ALL = "all"
VERBOSITY_LOG_CALLBACK_ONLY = "log_callback_only"
VERBOSITIES = (VERBOSITY_ALL, VERBOSITY_LOG_CALLBACK_ONLY)


class TextView:
    """Print rank output as it arrives: ``[rank] line``, or ``[rank@host] line`` across hosts.

    Parameters
    ----------
    verbosity : str
        ``"all"`` prints every line of every rank; ``"log_callback_only"`` prints only what
        ranks send with :func:`hvd_magics.log_to_driver` (everything still reaches the log file).
    stream : file, optional
        Where to print (``sys.stdout`` at the time of each print by default).
    """

    def __init__(self, verbosity: str = VERBOSITY_ALL, stream: IO[str] | None = None) -> None:
        if verbosity not in VERBOSITIES:
            raise ValueError(f"driver_log_verbosity must be one of {VERBOSITIES}, got {verbosity!r}")
        self.verbosity = verbosity
        self._stream = stream

    def _prefix(self, job: JobState, rank: int) -> str:
        hosts = {r.host for r in job.ranks if r.host}
        return f"[{rank}@{job.ranks[rank].host}]" if len(hosts) > 1 else f"[{rank}]"

    def on_event(self, job: JobState, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "output" and self.verbosity == VERBOSITY_ALL:
            lines = event.get("lines", [])
        elif kind == "log":
            lines = [event.get("text", "")]
        else:
            return
        stream = self._stream or sys.stdout
        prefix = self._prefix(job, event["rank"])
        stream.write("".join(f"{prefix} {line}\n" for line in lines))
        stream.flush()

    def on_end(self, job: JobState) -> None:
        pass
