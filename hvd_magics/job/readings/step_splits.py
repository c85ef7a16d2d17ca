"""What the ranks said of their steps, kept as they report them: each step's row split into
input, compute and communication (:mod:`hvd_magics.rank.instruments.step_split`), each rank's
totals and the intervals they came in, its clock, its CPU pace probes, its memory, and who each
step every rank reported waited for (:mod:`hvd_magics.job.readings.wait_accounting`).

The straggler verdict judges them as they arrive
(:class:`hvd_magics.job.verdicts.straggler.StepSplits`).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, cast

from hvd_magics.job.readings.memory_readings import MemoryReadings
from hvd_magics.job.readings.step_parts import StepParts, clock_label, step_columns, window_parts
from hvd_magics.job.readings.wait_accounting import Row, StepDelay, step_delay
from hvd_magics.protocol import STEP_COLUMNS

#: Steps kept per rank for the looks (a rank sends at most 256 at a time)...
KEPT_STEPS = 2304
#: The steps the dashboard's bar of a rank reads.
WINDOW_STEPS = 8
#: The least CPU pace probes of each rank a window is read over (the window's, or the latest
#: before its end when it holds fewer).
PACE_PROBES = 3


class StepReadings:
    """What the ranks said of their steps.

    Attributes
    ----------
    rows : dict
        Rank -> step -> its row (:data:`hvd_magics.protocol.STEP_COLUMNS`), the latest
        :data:`KEPT_STEPS`.
    delays : dict
        Step -> who delayed it, by how much, for each step every rank's row of is kept.
    reported : int or None
        The latest step every rank reported (``None`` until every rank of the job has).
    intervals : list of dict
        One row per rank's report (a few a second): ``rank``, ``time_s`` (since the job
        began), ``steps`` and the mean ``step_s``, ``input_s``, ``compute_s``, ``comm_s``,
        ``cpu_wait_s``, ``cpu_s`` of those steps.
    """

    def __init__(self, started_at: float | None = None, ranks: int | None = None) -> None:
        self.started_at = time.monotonic() if started_at is None else started_at
        #: The job's ranks, when known: no step is judged before every one of them reported.
        self.ranks = ranks
        self.rows: dict[int, dict[int, Row]] = {}
        #: Rank -> ``[steps, then the sum of each column]`` over the whole job.
        self.totals: dict[int, list[float]] = {}
        self.delays: dict[int, StepDelay] = {}
        #: The ranks whose rows :attr:`delays` were read from.
        self._delayed_ranks: set[int] = set()
        self.reported: int | None = None
        self.intervals: list[dict[str, Any]] = []
        self.memory = MemoryReadings()
        #: Rank -> whose clock its rows are: ``"gpu"`` or ``"host"``.
        self.clock: dict[int, str] = {}
        #: Ranks whose CPU time is not read (TensorFlow's: ``cpu_read`` false in their events).
        self.cpu_unread: set[int] = set()
        #: Rank -> step -> seconds of its CPU pace probe after that step.
        self.paces: dict[int, dict[int, float]] = {}

    def observe(self, rank: int, event: dict[str, Any], hosts: dict[int, str]
                ) -> StepParts | None:
        """Take one rank's ``step_split`` event and account for every step all ranks have
        now reported; the mean of the steps it reported (``None``: none)."""
        self.clock[rank] = event.get("clock") or "host"
        if event.get("cpu_read") is False:
            self.cpu_unread.add(rank)
        self.memory.observe(rank, event)
        rows, width = self.rows.setdefault(rank, {}), len(STEP_COLUMNS)
        for step, *columns in event.get("rows") or []:
            rows[int(step)] = cast(Row, tuple(float(v) for v in (columns + [0.0] * width)[:width]))
        for old in sorted(rows)[:-KEPT_STEPS]:
            del rows[old]
        paces = self.paces.setdefault(rank, {})
        for step, seconds in event.get("pace") or []:
            if float(seconds) > 0:
                paces[int(step)] = float(seconds)
        for old in sorted(paces)[:-KEPT_STEPS]:
            del paces[old]
        parts = self._add_totals(rank, event)
        self._account(hosts)
        return parts

    def _add_totals(self, rank: int, event: dict[str, Any]) -> StepParts | None:
        """Add the event's ``totals`` to the rank's; the mean of its steps (``None``: none)."""
        width = len(STEP_COLUMNS)
        count, *sums = (list(event.get("totals") or [0]) + [0.0] * width)[:width + 1]
        if not count:
            return None
        totals = self.totals.setdefault(rank, [0] + [0.0] * width)
        for i, value in enumerate([count, *sums]):
            totals[i] += value
        parts = StepParts(*(value / count for value in sums))
        self.intervals.append({
            "rank": rank, "time_s": round(event.get("recv", time.monotonic())
                                          - self.started_at, 3),
            "steps": int(count), **step_columns(parts)})
        return parts

    def _account(self, hosts: dict[int, str]) -> None:
        """Who delayed each step every rank has now reported (:attr:`delays`), once every rank
        of the job has; :attr:`reported` follows (``None`` while one has not)."""
        if len(self.rows) < max(2, self.ranks or 0) or not all(self.rows.values()):
            self.reported = None
            return
        if set(self.rows) != self._delayed_ranks:  # a rank reported late: its steps count
            self.delays.clear()
            self._delayed_ranks = set(self.rows)
        reported = min(max(rows) for rows in self.rows.values())
        read = not self.cpu_unread
        # every step up to the reported one that all ranks have now (a rank's row of a step
        # may come after the others' of later steps: a stall's step was missing from the looks)
        for step in range(max(1, reported - KEPT_STEPS + 1), reported + 1):
            if step not in self.delays and all(step in rows for rows in self.rows.values()):
                self.delays[step] = step_delay(
                    step, {rank: rows[step] for rank, rows in self.rows.items()}, hosts, read)
        kept = max(min(rows) for rows in self.rows.values())  # every rank still has its row
        for old in [s for s in self.delays if s <= reported - KEPT_STEPS or s < kept]:
            del self.delays[old]
        self.reported = reported

    def recent(self, step: int, steps: int, since: int = 0) -> list[StepDelay]:
        """The delays of the latest ``steps`` steps up to ``step`` that every rank reported,
        after step ``since``."""
        return [self.delays[s] for s in range(max(step - steps, since) + 1, step + 1)
                if s in self.delays]

    def lasting(self, step: int, steps: int, need_s: float, most: int, since: int = 0
                ) -> list[StepDelay]:
        """:meth:`recent`'s window, taken back over as many steps as span ``need_s`` seconds
        (at most ``most`` steps); empty when the steps kept after ``since`` do not reach that
        far yet."""
        window = self.recent(step, steps, since)
        wall = sum(d.wall_s for d in window)
        if wall >= need_s or len(window) >= most:
            return window
        earlier: list[StepDelay] = []
        for s in range(step - steps, since, -1):
            d = self.delays.get(s)
            if d is None:
                continue
            earlier.append(d)
            wall += d.wall_s
            if wall >= need_s or len(window) + len(earlier) >= most:
                return earlier[::-1] + window
        return []

    def pace(self, rank: int, window: list[StepDelay]) -> float | None:
        """The median of ``rank``'s CPU pace probes over the ``window``'s steps (or its latest
        :data:`PACE_PROBES` up to the window's end, when it holds fewer); ``None``: none."""
        paces = self.paces.get(rank) or {}
        first, last = window[0].step, window[-1].step
        inside = [v for s, v in paces.items() if first <= s <= last]
        if len(inside) < PACE_PROBES:
            inside = [paces[s] for s in sorted(s for s in paces if s <= last)[-PACE_PROBES:]]
        return statistics.median(inside) if len(inside) >= PACE_PROBES else None

    def per_rank(self) -> dict[int, StepParts]:
        """Each rank's mean step over the whole job."""
        return {rank: StepParts(*(value / t[0] for value in t[1:]))
                for rank, t in sorted(self.totals.items()) if t[0]}

    def steps_of(self, rank: int) -> int:
        """How many steps ``rank`` reported."""
        return int(self.totals.get(rank, [0])[0])

    def latest(self, rank: int, rhythm: bool = True) -> StepParts | None:
        """``rank``'s mean step over its latest window, as the dashboard shows it: a single
        step far longer than the others left out, several kept (:func:`window_parts`; the
        looks leave them out, ``rhythm`` false). A rank whose every third step waited 40 ms for
        its input showed no wait at all."""
        rows = self.rows.get(rank)
        if not rows:
            return None
        return window_parts([rows[s] for s in sorted(rows)[-WINDOW_STEPS:]], rhythm)

    def host_clocked(self) -> bool:
        """Whether every rank's rows are its host thread's on a CPU (no GPU: there the host
        thread also waits for the device off the CPU)."""
        return all(self.clock.get(r, "host") == "host" and not self.memory.on_gpu(r)
                   for r in self.rows)

    def rank_rows(self, hosts: dict[int, str]) -> list[dict[str, Any]]:
        """Per rank: ``rank``, ``host``, ``steps`` and the mean ``step_s``, ``input_s``,
        ``compute_s``, ``comm_s``, ``cpu_wait_s``, ``cpu_s`` over the job, its clock and
        memory (:meth:`MemoryReadings.columns`)."""
        return [{"rank": rank, "host": hosts.get(rank, ""), "steps": self.steps_of(rank),
                 **step_columns(parts), "clock": self.clock.get(rank, "host"),
                 **self.memory.columns(rank)}
                for rank, parts in self.per_rank().items()]

    def clock_of(self, rank: int) -> str:
        """What ``rank``'s shares are prefixed with:
        :data:`~hvd_magics.job.readings.step_parts.GPU_TIME`,
        :data:`~hvd_magics.job.readings.step_parts.HOST_TIME` on a GPU rank timed by its host,
        else ``""``."""
        return clock_label(self.clock.get(rank, "host"), self.memory.on_gpu(rank))

    def memory_text(self, rank: int) -> str:
        """``rank``'s memory in a few words (:meth:`MemoryReadings.text`)."""
        return self.memory.text(rank)
