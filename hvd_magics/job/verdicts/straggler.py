"""Which rank holds the others back, and why: the driver's reading of the ranks' step splits.

Each rank sends its steps' time split into input, compute and communication
(:mod:`hvd_magics.rank.instruments.step_split`). In data-parallel training every rank's step lasts
as long as the slowest rank's: the ranks differ in how they spend it. A rank whose own work (input
and compute) is longer than the others' while they wait for it in communication holds them back.

Who holds the others back is read from what they lose
(:mod:`hvd_magics.job.readings.wait_accounting`): in each step, the time the slowest rank's own work
exceeded the next one's, summed over a window of the latest steps every rank reported
(:data:`WINDOWS`: the shortest first, the longest for a stall every fiftieth step). A rank (or every
rank of one host) is named when it accounts for most of that time, the time is a meaningful share of
the job's, and chance on equal ranks does not explain it (slowest in too many of the steps that lost
time, or stalling the others at a regular period); noise spreads over every rank, a periodic stall
counts in full. Where the ranks' CPU time is read, a delay that was its wait for a CPU beyond the
next rank's is its host's condition: on several hosts, a host whose ranks the others wait for that
way is named for it; otherwise the busy host is said once (:class:`BusyHosts`), and no rank is named
for it. A slowdown of a rank's own work by less than :data:`LARGE_EXCESS` is named only over a
window of :data:`EVIDENCE_S` or more, its own work :data:`VERDICT_SHARE` longer on average there:
a CPU shared with other work slows equal ranks in turn for up to a second. A rank whose CPU ran
its pace probes (:mod:`hvd_magics.rank.instruments.step_split`) slower than the others' by
:data:`PACE_SHARE` of its excess or more is the host's condition, said once, not named; a rank
whose own work is not longer than the others' over the window is never named. A named rank is
cleared when its delays no longer cost :data:`CLEAR_SHARE` of the latest steps' time.

Its cause and figures are read over the window that named it. The cause is the part of its own
work (input or compute) that exceeds the others' the more once the rank's wait for a CPU in that
part beyond theirs is taken out (what named it is its own work net of that wait: a rank whose
data loader sleeps every third batch, starved of a CPU in compute for a spell on a busy host,
was said to be slow "in compute, most of it waiting for a CPU"). The cause's excess that is at
least half time the rank's training thread waited for a CPU in that part (ready to run, not
running: its host's CPUs busy with other work, or its CPU time limited) beyond the others' wait
for as much time on one, and at most a quarter of it the rank's thread ran on one longer than the
others' threads (with their wait for that time: on a busy host more work waits in proportion), is
said to be that, not more work or slower input; one whose wait beyond the others' is at least a
quarter of it, but which ran longer too, is said to be both, with their figures; on a CPU rank,
a compute excess its thread neither ran nor waited for a CPU (a sleep, a read, a lock) is said
to be off the CPU. A wait for a CPU beyond the others' in the other part, a quarter of its whole
excess or more, is said besides. On ranks whose CPU time is not read (TensorFlow's), every
verdict says that it may be a wait for a CPU. When the named rank's own collectives cost most of
its step and far more than its excess (a slow link), its verdict says so.

A link slower than the others' slows every rank's communication alike: no rank is named then
(the split shows every rank waiting in communication).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hvd_magics.job.readings.step_parts import StepParts, window_parts
from hvd_magics.job.readings.step_splits import KEPT_STEPS, StepReadings
from hvd_magics.job.readings.wait_accounting import COST_SHARE, StepDelay
from hvd_magics.job.verdicts.busy_hosts import (BusyHosts, busy_hosts, cpu_slower, hosts_busy,
                                                on_a_slower_cpu)
from hvd_magics.job.verdicts.straggler_accused import Accused, accused
from hvd_magics.job.verdicts.straggler_verdict import (MIN_EXCESS_S, NAME_SHARE, Straggler,
                                                       verdict)

#: The windows (steps) a look reads, shortest first: a rank slowed from a step on is named
#: over the first, a stall every tenth step over the second, one every fiftieth over the last.
WINDOWS = (15, 60, 240)
#: How much longer on average over the window that names it a slowdown must be than the
#: others' (a share of their own work, as
#: :data:`~hvd_magics.job.verdicts.straggler_verdict.NAME_SHARE`; a verdict kept while it holds
#: too): equal ranks of 30 ms of work a step, beside 0-2 busy processes, differed by 8-10% for
#: seconds on end (named in 2 of 14 recorded runs), and a verdict kept said "1% longer".
VERDICT_SHARE = 0.15
#: A named rank is cleared when the others lose less than this share of the latest steps' time
#: to it (half what names it: :data:`hvd_magics.job.readings.wait_accounting.COST_SHARE`).
CLEAR_SHARE = COST_SHARE / 2
#: The least excess that counts on ranks whose CPU time is not read (as
#: :data:`~hvd_magics.job.verdicts.straggler_verdict.MIN_EXCESS_S` on the others; TensorFlow's,
#: whose threads the host schedules in turn: a clean Keras fit of 1.5 ms of own work a step on
#: two cores named ranks 0.27 to 0.7 ms longer, none of them slowed).
MIN_EXCESS_UNREAD_S = 0.002
#: The least time a window that names a rank for a slowdown spans (a rhythm or a periodic
#: stall is named over its own window, and an excess of :data:`LARGE_EXCESS` or more over the
#: usual ones): the steps are looked at over as many as last that long, up to
#: :data:`LASTING_STEPS`. A CPU shared with other work slows one rank and then another for tens
#: of milliseconds to a second or more at a time. Recorded clean runs beside 0-4 busy processes,
#: replayed: equal ranks of 1 ms of work a step were named in 18 of 18 runs over windows of
#: 15-60 steps, in 7 of 18 over a second, in 1 of 18 over two (none with the CPU's pace read);
#: of 30 ms of work beside 4, over 21 steps (0.5 s) in 1 of 3.
EVIDENCE_S = 2.0
LASTING_STEPS = 2048
#: A share of the others' own work: a rank whose own work (net of its wait for a CPU beyond
#: theirs) is longer by this much or more is named over the usual windows.
LARGE_EXCESS = 1.0
#: The most looks one report leads to (with more new steps, every n-th step is looked
#: at: a job of many short steps costs the driver little).
LOOKS_PER_REPORT = 64


class StepSplits(StepReadings):
    """What the ranks said of their steps (:class:`StepReadings`), judged as it arrives: the
    straggler verdict drawn from it.

    Attributes
    ----------
    current : Straggler or None
        The rank (or host) holding the others back now.
    events : list of (str, Straggler or BusyHosts)
        Each time one was named (``"named"``) or caught up (``"cleared"``), and when the hosts
        were found busy with other work (``"busy"``), in order.
    """

    def __init__(self, started_at: float | None = None, ranks: int | None = None) -> None:
        super().__init__(started_at, ranks)
        self._looked = 0
        #: Who is named now (:data:`Accused`).
        self._named: Accused | None = None
        #: The step its verdict was last cleared at.
        self._since = 0
        self.current: Straggler | None = None
        #: The hosts' condition, said once: busy with other work (:class:`BusyHosts`).
        self.busy: BusyHosts | None = None
        #: Whether the latest look found the hosts so (the live line says it only then).
        self.busy_now = False
        self.events: list[tuple[str, Straggler | BusyHosts]] = []

    def observe(self, rank: int, event: dict[str, Any], hosts: dict[int, str]
                ) -> StepParts | None:
        """Take one rank's ``step_split`` event (:meth:`StepReadings.observe`) and look again
        at every step all ranks have now reported; the mean of the steps it reported (``None``:
        none)."""
        parts = super().observe(rank, event, hosts)
        if self.reported is not None:
            self._look_up_to(hosts, self.reported)
        return parts

    def _look_up_to(self, hosts: dict[int, str], reported: int) -> None:
        first = max(self._looked + 1, reported - KEPT_STEPS + WINDOWS[0])
        stride = max(1, -(-(reported + 1 - first) // LOOKS_PER_REPORT))
        for step in range(first, reported + 1, stride):
            self._judge(hosts, step)
        self._looked = max(self._looked, reported)

    def _recent(self, step: int, steps: int) -> list[StepDelay]:
        """The delays of the latest ``steps`` steps up to ``step`` that every rank reported,
        since the last verdict was cleared (what named it is no evidence after that)."""
        return self.recent(step, steps, self._since)

    def _evidence_s(self, hosts: dict[int, str], step: int, window: list[StepDelay],
                    found: Accused) -> float:
        """How long the slowdown ``found`` over the ``window`` must have lasted to be named:
        :data:`EVIDENCE_S`, or nothing for an excess of :data:`LARGE_EXCESS` or more net of
        the rank's wait for a CPU beyond the others' (no busy CPU was seen to double a rank's
        own work but by that wait)."""
        self._named = found
        try:
            seen = self._verdict(hosts, step, window)
        finally:
            self._named = None
        net = seen.own_s - seen.cpu_wait_s
        return 0.0 if seen.others_s > 0 and net >= (1 + LARGE_EXCESS) * seen.others_s \
            else EVIDENCE_S

    def _judge(self, hosts: dict[int, str], step: int) -> None:
        if self.current is not None:
            if self._still_holds(hosts, step):
                return
            self.events.append(("cleared", dataclasses.replace(self.current, step=step)))
            self.current, self._named, self._since = None, None, step
        read = 0
        for steps in WINDOWS:  # each window as far as the steps reported reach
            window = self._recent(step, steps)
            if len(window) < WINDOWS[0] or len(window) == read:
                continue
            read = len(window)
            found = accused(list(self.rows), hosts, window, self._least())
            if found is not None and not found[2].period:
                # a slowdown, not a rhythm or a periodic stall: named once it lasted
                need = self._evidence_s(hosts, step, window, found)
                if sum(d.wall_s for d in window) < need:
                    window = self.lasting(step, steps, need, LASTING_STEPS, self._since)
                    found = (accused(list(self.rows), hosts, window, self._least())
                             if window else None)
            if found is not None:
                self._named = found
                candidate = self._verdict(hosts, step, window)
                slower = cpu_slower(self, candidate, window)
                if not self._borne_out(candidate) or slower is not None:
                    self._named = None
                    if slower is not None:
                        self._say_busy(on_a_slower_cpu(candidate, slower, len(window), step))
                    continue
                self.current = candidate
                self.events.append(("named", self.current))
                return
        self._busy(hosts, step)

    def _lost_to(self, window: list[StepDelay]) -> tuple[float, float]:
        """The time the ``window``'s steps lost to the named rank (or host), and all they lost
        in the same way (its own work, or waits for a CPU)."""
        assert self._named is not None  # asked only while a rank (or host) is named
        ranks, whole, finding, kind = self._named
        if whole or kind == "cpu":
            pick = (lambda d: (d.host, d.host_own_s)) if kind == "own" else (
                lambda d: (d.host, d.host_cpu_s))
            who = finding.who
        else:
            pick, who = (lambda d: (d.rank, d.own_s)), ranks[0]
        mine = sum(pick(d)[1] for d in window if pick(d)[0] == who)
        return mine, sum(pick(d)[1] for d in window)

    def _still_holds(self, hosts: dict[int, str], step: int) -> bool:
        """Whether the named rank still costs the others :data:`CLEAR_SHARE` of the latest
        steps' time (over three of its stalls' periods, at least :data:`WINDOWS`' first), and
        most of what they lose; its figures brought up to date when it does."""
        # asked only while one is named: _judge sets both, and clears both
        assert self._named is not None and self.current is not None
        finding = self._named[2]  # over three of its stalls' periods, or as long as it was
        window = self._recent(step, max(WINDOWS[0], 3 * finding.period,  # named over
                                        0 if finding.period else finding.steps))
        if not window:
            return True
        mine, lost = self._lost_to(window)
        if mine < CLEAR_SHARE * sum(d.wall_s for d in window) or mine < lost / 2:
            return False
        fresh = self._verdict(hosts, self.current.step, window)
        if not self._borne_out(fresh) or cpu_slower(self, fresh, window) is not None:
            return False
        if fresh.ranks == self.current.ranks and fresh.lost_share >= COST_SHARE:
            self.current = fresh
            for i in range(len(self.events) - 1, -1, -1):
                if self.events[i][0] == "named":
                    self.events[i] = ("named", fresh)
                    break
        return True

    def _verdict(self, hosts: dict[int, str], step: int, window: list[StepDelay]) -> Straggler:
        """The named rank's verdict: its cause and figures over the ``window``'s steps (every
        step kept: a stall is what the others waited for), what the others lost to it."""
        assert self._named is not None  # _judge named them just before
        ranks, whole, _, _ = self._named
        # every rank still has its row of each step judged (StepReadings drops the others)
        parts = {rank: window_parts([rows[d.step] for d in window], keep_all=True)
                 for rank, rows in self.rows.items()}
        mine, _ = self._lost_to(window)
        wall = sum(d.wall_s for d in window)
        host_clock = self.host_clocked()
        found = verdict(parts, hosts, list(ranks), whole, by_net=host_clock)
        least = self._least()
        delayed = sum(1 for d in window if d.rank in ranks
                      and d.own_s + d.cpu_s >= max(least, NAME_SHARE * d.base_s))
        known = host_clock and all((self.totals.get(r) or [0] * 6)[5] > 0  # its cpu_s
                                   for r in self.rows)
        return dataclasses.replace(
            found, step=step, cpu_known=known, cpu_read=not self.cpu_unread,
            lost_share=mine / wall if wall > 0 else 0.0, lost_steps=len(window),
            longer_in=(delayed, len(window)))

    def _borne_out(self, found: Straggler) -> bool:
        """Whether the window's means bear a verdict out: the named ranks' own work longer
        than the others' (by the least delay that counts). What names a rank is its own work
        net of its waits for a CPU beyond the others', step by step; where the others waited
        for a CPU longer still, the named rank's own work was shorter on average, and its
        verdict said it took "-6% longer". A slowdown (not a rhythm or a periodic stall, whose
        steps between are the others' own) is longer by :data:`VERDICT_SHARE` of the others'
        own work on average."""
        assert self._named is not None  # asked while a rank is named, or about to be
        excess = found.own_s - found.others_s
        return excess >= self._least() and (
            bool(self._named[2].period) or excess >= VERDICT_SHARE * found.others_s)

    def _say_busy(self, busy: BusyHosts) -> None:
        """Say the hosts' condition, once."""
        if self.busy is None:
            self.busy = busy
            self.events.append(("busy", busy))

    def _busy(self, hosts: dict[int, str], step: int) -> None:
        """Say once that the ranks' hosts are busy with other work, when their waits for a CPU
        beyond one another cost :data:`COST_SHARE` of the latest steps' time and no rank (or
        host) accounts for it."""
        window = self._recent(step, WINDOWS[1])
        if len(window) < WINDOWS[0]:
            return
        self.busy_now = hosts_busy(window)
        if self.busy_now and self.busy is None:
            self._say_busy(busy_hosts(window, hosts, step))

    def _least(self) -> float:
        """The least delay that counts a step as one that lost time:
        :data:`MIN_EXCESS_UNREAD_S` when a rank's CPU time is not read."""
        return MIN_EXCESS_UNREAD_S if self.cpu_unread else MIN_EXCESS_S

    def comm_bound(self, share: float) -> float | None:
        """The least share of its latest steps any rank spent in communication, when every
        rank (of at least two) spent at least ``share`` and no rank is named; else ``None``."""
        if self.current is not None or len(self.rows) < 2:
            return None
        latest = [self.latest(rank, rhythm=False) for rank in self.rows]
        if any(p is None or p.step_s <= 0 for p in latest):
            return None
        least = min(p.comm_s / p.step_s for p in latest if p is not None)
        return least if least >= share else None

    def now(self, unit: str = "rank") -> str:
        """The verdict on the rank (or host) holding the others back now; else the hosts'
        condition when they were found busy (:class:`BusyHosts`); ``""`` when neither."""
        if self.current is not None:
            return self.current.text(unit)
        return self.busy.text(unit) if self.busy is not None and self.busy_now else ""

    def verdicts(self, unit: str = "rank") -> list[str]:
        """What was found, one line per rank (or host) named: its verdict, the step it was
        named at and, once it caught up, that step; and the hosts' condition, when said."""
        lines: list[str] = []
        named = -1
        for what, found in self.events:
            if what in ("named", "busy"):
                lines.append(f"from step {found.step}: {found.text(unit)}")
                named = len(lines) - 1 if what == "named" else named
            elif named >= 0:
                lines[named] += f" (caught up by step {found.step})"
        return lines
