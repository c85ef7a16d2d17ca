"""Events kept in the Spark task when the executors cannot reach the notebook (no live view).

A remote Spark Connect client, or a firewall between the executors and the notebook, leaves the
event channel (:mod:`hvd_magics.channel`) out of reach. Then a task keeps its rank's events here
and returns them with its status through the Spark result, in chunks small enough for any
client; the driver replays them when the job ends. Only what the end needs is kept: every event
but the live ones (progress and unfinished lines), and of the output the first and last
``KEPT_LINES`` lines, with a line that says how many were left out.
"""
from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterator

from hvd_magics.channel import stamp
from hvd_magics.events import Event, OutputEvent, Wire
from hvd_magics.protocol import OUTPUT, OUTPUT_PARTIAL, PROGRESS

#: Output lines kept from the start and from the end of a rank's output.
KEPT_LINES = 5000
#: Characters of events in one row of the Spark result.
CHUNK_CHARS = 1 << 20
#: Events shown only while a job runs.
_LIVE_ONLY = frozenset({PROGRESS, OUTPUT_PARTIAL})


class EventBuffer:
    """Keep a rank's events (the same ``send`` as :class:`hvd_magics.channel.EventClient`)."""

    def __init__(self, rank: int, host: str, job_id: str) -> None:
        self._rank, self._host, self._job_id = rank, host, job_id
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._head_lines = 0
        self._tail: collections.deque[Event] = collections.deque()
        self._tail_lines = 0
        self._dropped = 0

    def send(self, event: Event) -> None:
        """Keep ``event``, stamped (dropped when it only matters live)."""
        if event["kind"] in _LIVE_ONLY:
            return
        lines = len(event["lines"]) if event["kind"] == OUTPUT else 0
        event = stamp(event, self._rank, self._host, self._job_id)
        with self._lock:
            if lines and self._head_lines < KEPT_LINES:
                self._head_lines += lines
                self._events.append(event)
            elif not lines and not self._tail:
                self._events.append(event)
            else:
                self._tail.append(event)
                self._tail_lines += lines
                self._trim()

    def _trim(self) -> None:
        """Drop the oldest output of the tail while it holds more than ``KEPT_LINES`` lines;
        other events are never dropped (they move on, after a line saying what was left out)."""
        while self._tail and self._tail_lines > KEPT_LINES:
            event = self._tail.popleft()
            if event["kind"] == OUTPUT:
                self._tail_lines -= len(event["lines"])
                self._dropped += len(event["lines"])
            else:
                self._mark_dropped()
                self._events.append(event)

    def _mark_dropped(self) -> None:
        if self._dropped:
            self._events.append(stamp(OutputEvent(kind=OUTPUT, lines=[
                f"[hvd_magics: {self._dropped:,} lines of output left out here]"]),
                self._rank, self._host, self._job_id))
            self._dropped = 0

    def close(self) -> None:
        """Nothing to close (the same interface as the channel's client)."""

    def chunks(self) -> Iterator[str]:
        """The kept events as JSON lines, cut into pieces of at most ``CHUNK_CHARS``."""
        with self._lock:
            self._mark_dropped()
            self._events.extend(self._tail)
            self._tail.clear()
            text = "\n".join(json.dumps(event) for event in self._events)
        for start in range(0, len(text), CHUNK_CHARS):
            yield text[start:start + CHUNK_CHARS]


def replay(chunks: list[str]) -> list[Wire]:
    """The events of one task from its chunks, in order."""
    text = "".join(chunks)
    return [json.loads(line) for line in text.splitlines() if line]
