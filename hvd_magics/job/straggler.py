"""Which rank holds the others back, and why: the driver's reading of the ranks' step splits.

Each rank sends its steps' time split into input, compute and communication
(:mod:`hvd_magics.rank.step_split`). In data-parallel training every rank's step lasts as long
as the slowest rank's: the ranks differ in how they spend it. A rank whose own work (input and
compute) is longer than the others' while they wait for it in communication holds them back.

A look reads the latest :data:`WINDOW_STEPS` steps every rank has reported (a single step far
longer than the window's usual one, an evaluation or a checkpoint, is left out of it; several
are kept: a rhythm of the job). A rank (or every
rank of one host) is named only when :data:`LOOKS_TO_NAME` looks in a row, one per step, find the
same one: its own work per step longer than the others' by at least :data:`NAME_SHARE` of
theirs (and :data:`MIN_EXCESS_S`; :data:`MIN_EXCESS_UNREAD_S` on TensorFlow's ranks), and the
others waiting for it in communication for at least half of that. It is cleared when as many
looks in a row no longer find it by half that margin. Its cause and figures are read over
all the steps those looks read (:data:`STREAK_STEPS`). The cause is the part of its own work
(input or compute) that exceeds the others' the more; an excess that is at least half time the
rank's training thread waited for a CPU outside collectives (ready to run, not running: its
host's CPUs busy with other work, or its CPU time limited) beyond the others' wait for as much
time on one, and at most a quarter of it the rank's thread ran on one longer than the others'
threads (with their wait for that time: on a busy host more work waits in proportion), is said
to be that, not more work or slower input; one whose wait beyond the others' is at least a
quarter of it, but which ran longer too, is said to be both, with their figures; on a CPU rank,
a compute excess its thread neither ran nor waited for a CPU (a sleep, a read, a lock) is said
to be off the CPU. On ranks whose CPU time is not read (TensorFlow's), every verdict says that
it may be a wait for a CPU. A look finds a rank
only when its own work was longer in at least half its steps (:func:`steady`; the ranks of a
host when one of them was, for under a CPU quota they take turns to wait for it: seldom longer
together, they must then be so in two thirds of the steps of the looks that name them,
:data:`TURNS_SHARE`), or in every step
of one phase of a short rhythm (:func:`rhythmic`: a loader that makes every third batch late),
which the steps of the looks that name it must show too: a step or two far longer, a busy
host's scheduler starving the rank, make a window's mean but not a straggler. When the named
rank's own collectives cost most of its step and far more than its excess (a slow link), its
verdict says so.

A link slower than the others' slows every rank's communication alike: no rank is named then
(the split shows every rank waiting in communication).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Any

from hvd_magics.rank_names import ranks_named

#: Steps one look reads...
WINDOW_STEPS = 8
#: ...and how many looks in a row (one per step) must find the same rank before it is named, or
#: no longer find it before it is cleared.
LOOKS_TO_NAME = 8
#: The least share of a look's steps in which a rank's own work must be longer than the others'
#: for the look to find it (see :func:`steady`).
STEADY_SHARE = 0.5
#: The least share of the steps of the looks that name a host's ranks in which one of them
#: must have been longer, when they were seldom longer together (:meth:`StepSplits._shown_by`):
#: under a CPU quota they take turns to wait for it, in 8 to 15 of 15 steps; ranks starved at
#: random, each in one step of ten, were so in 8 of 15 by chance.
TURNS_SHARE = 2 / 3
#: The periods (in steps) at which a rank late in fewer of a look's steps is found when it
#: is late in every step of one phase (:func:`rhythmic`), through the look's steps and through
#: the steps of the looks that name it.
RHYTHMS = (2, 3, 4)
#: ...late in at least this many cycles of the steps that name it (three late steps four steps
#: apart are a host's scheduler as likely as a rhythm).
STREAK_CYCLES = 4
#: The steps the looks that name a rank read together: its cause and figures are judged over
#: them all.
STREAK_STEPS = WINDOW_STEPS + LOOKS_TO_NAME - 1
#: How much longer (a share of the others' own work) a rank's own work must be than theirs to be
#: named, and below which it is cleared.
NAME_SHARE = 0.08
CLEAR_SHARE = NAME_SHARE / 2
#: ...and never less than this many seconds a step: a smaller difference is within what timing
#: a step's parts costs and how much a step of a fraction of a millisecond varies.
MIN_EXCESS_S = 0.0002
#: ...and on ranks whose CPU time is not read (TensorFlow's, whose threads the host schedules
#: in turn: a clean Keras fit of 1.5 ms of own work a step on two cores named ranks 0.27 to
#: 0.7 ms longer, none of them slowed).
MIN_EXCESS_UNREAD_S = 0.002
#: Of that excess, the least share the others must spend waiting in communication.
WAIT_SHARE = 0.5
#: A step longer than this many times the window's median is left out of a look.
OUTLIER = 3.0
#: Steps kept per rank for the looks (a rank sends at most 256 at a time)...
KEPT_STEPS = 288
#: ...and the most looks one report leads to (with more new steps, every n-th step is looked
#: at: a job of many short steps costs the driver little).
LOOKS_PER_REPORT = 64
#: What a GPU rank's split is prefixed with: its clock is the host thread's (the GPU's kernels
#: run asynchronously; where the thread waits for them is where their time shows).
HOST_TIME = "host time: "
#: ...and a DDP rank's on a CUDA device, timed by the GPU's own events (rank/gpu_steps.py).
GPU_TIME = "GPU time: "
#: Of a compute excess, the least share of waiting for a CPU that makes it "waiting for a CPU",
#: and the most share of running on one longer than the others (more work runs longer, even
#: on a CPU that other threads share with it).
CPU_WAIT_SHARE = 0.5
CPU_RAN_SHARE = 0.25
#: A verdict says that communication costs more than the rank's excess when the rank's own
#: time in collectives is at least this share of its step and this many times the excess (the
#: slow-link test named a rank 1.2 ms a step longer in its own work while its steps spent
#: about 100 ms in collectives).
COMM_SHARE = 0.5
COMM_TIMES = 2.0
#: The causes a verdict names.
INPUT, COMPUTE = "input", "compute"
_PART = {INPUT: "in its input pipeline", COMPUTE: "in compute"}
_CAUSE_TEXT = {INPUT: f"{_PART[INPUT]} (waiting for batches)",
               COMPUTE: f"{_PART[COMPUTE]} (forward, backward, optimizer)"}
_CPU_WAIT_WHY = "(its host's CPUs are busy with other work, or its CPU time is limited)"
_CPU_WAIT_TEXT = {cause: f"{part}, most of it waiting for a CPU {_CPU_WAIT_WHY}"
                  for cause, part in _PART.items()}
#: ...and on ranks whose CPU time is not read (TensorFlow's): a rank starved of a CPU is late
#: in its input as in its compute (a clean DistributedGradientTape loop beside busy lanes named
#: a rank "in its input pipeline (waiting for batches)").
_UNREAD = "on a busy host: TensorFlow's threads' CPU time is not read"
_UNREAD_TEXT = {INPUT: f"{_PART[INPUT]} (waiting for batches, or for a CPU {_UNREAD})",
                COMPUTE: f"{_PART[COMPUTE]} (forward, backward, optimizer, or a wait for a CPU "
                         f"{_UNREAD})"}
_OFF_CPU_TEXT = ("in its own code but mostly off the CPU, not waiting for one (sleeping, reading "
                 "files, waiting on a lock or a subprocess)")


@dataclass(frozen=True)
class StepParts:
    """Mean seconds per step of one rank: the whole step and its parts (``cpu_wait_s`` and
    ``cpu_s``: how long its training thread was ready to run but waited for a CPU, and ran on
    one, within any part)."""

    step_s: float
    input_s: float
    comm_s: float
    cpu_wait_s: float = 0.0
    cpu_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.input_s - self.comm_s)

    @property
    def own_s(self) -> float:
        """Its own work: everything but the wait in collectives."""
        return self.input_s + self.compute_s

    def shares(self, clock: str = "") -> str:
        """``"input 4% · compute 61% · comm 35%"``, after ``clock`` (:data:`HOST_TIME` or
        :data:`GPU_TIME` on a GPU rank)."""
        if self.step_s <= 0:
            return ""
        return clock + " · ".join(f"{name} {100 * value / self.step_s:.0f}%" for name, value in (
            ("input", self.input_s), ("compute", self.compute_s), ("comm", self.comm_s)))


@dataclass(frozen=True)
class Straggler:
    """A verdict: ``ranks`` (one, or every rank of ``host`` when ``whole_host``) hold the
    others back, their own work per step ``own_s`` against the others' ``others_s``, most of the
    difference in ``cause``; ``cpu_wait_s`` longer waiting for a CPU per step than the others,
    ``cpu_s`` longer on one; named at step ``step``."""

    ranks: tuple[int, ...]
    host: str
    whole_host: bool
    cause: str
    own_s: float
    others_s: float
    cpu_wait_s: float = 0.0
    cpu_s: float = 0.0
    #: The others' own work's wait for a CPU per second on one (the host's common waiting).
    wait_ratio: float = 0.0
    step: int = 0
    #: Whether its training thread's CPU time is known and its host clock tells its compute
    #: (a CPU rank: on a GPU, the host thread also waits for the device off the CPU).
    cpu_known: bool = False
    #: Whether the ranks' CPU time was read at all (not on TensorFlow's ranks, which compute
    #: on threads of their own: a compute excess there may be a host busy with other work).
    cpu_read: bool = True
    #: In how many of how many steps its own work was longer (``(0, 0)``: not counted).
    longer_in: tuple[int, int] = (0, 0)
    #: Its own time in collectives per step (it arrives last: the collectives' own cost), and
    #: its whole step.
    comm_s: float = 0.0
    step_s: float = 0.0

    @property
    def more_work_s(self) -> float:
        """Of its excess per step, what more time on a CPU explains, with the wait for a CPU
        every rank has per second on one (more work on a busy host waits in proportion)."""
        return self.cpu_s * (1 + self.wait_ratio)

    @property
    def starved_s(self) -> float:
        """Of its excess per step, its wait for a CPU beyond the others' in proportion to its
        time on one: a CPU it got less of than they did."""
        return self.cpu_wait_s - self.wait_ratio * self.cpu_s

    @property
    def waits_for_cpu(self) -> bool:
        """Whether its excess is mostly waiting for a CPU, not more work or slower input (more
        work runs longer on a CPU, and waits for one as long as the others' work does)."""
        excess = self.own_s - self.others_s
        return (excess > 0 and self.starved_s >= CPU_WAIT_SHARE * excess
                and self.more_work_s <= CPU_RAN_SHARE * excess)

    @property
    def off_cpu(self) -> bool:
        """Whether its compute excess is mostly time its thread neither ran nor waited for a
        CPU (a sleep, a file read, a lock): not forward and backward."""
        excess = self.own_s - self.others_s
        return (self.cpu_known and self.cause == COMPUTE and excess > 0
                and self.more_work_s <= CPU_RAN_SHARE * excess
                and self.starved_s < CPU_WAIT_SHARE * excess)

    @property
    def partly_waits_for_cpu(self) -> bool:
        """Whether a good part of its excess (:data:`CPU_RAN_SHARE`) is waiting for a CPU
        beyond the others' but more time on one says it is not most of it: both are said."""
        excess = self.own_s - self.others_s
        return (self.cpu_read and excess > 0 and self.starved_s >= CPU_RAN_SHARE * excess
                and not self.waits_for_cpu)

    def _cause_text(self) -> str:
        if self.waits_for_cpu:
            return _CPU_WAIT_TEXT[self.cause]
        if self.off_cpu:
            return _OFF_CPU_TEXT
        if self.partly_waits_for_cpu:
            return (f"{_PART[self.cause]}, {_ms(self.starved_s)} a step of it waiting for a CPU "
                    f"beyond the others' {_CPU_WAIT_WHY} and {_ms(self.more_work_s)} running on "
                    "one longer (more work, or the same work slowed on a CPU it shares with "
                    "other work)")
        if not self.cpu_read:
            return _UNREAD_TEXT[self.cause]
        return _CAUSE_TEXT[self.cause]

    def text(self, unit: str = "rank") -> str:
        longer = 100 * (self.own_s / self.others_s - 1) if self.others_s > 0 else float("inf")
        count, steps = self.longer_in
        often = (f" on average; longer in {count} of its last {steps} steps"
                 if 0 < count < STEADY_SHARE * steps else "")
        figures = f"{longer:.0f}% longer per step than the others' ({self.own_s:.3g} s against " \
                  f"{self.others_s:.3g} s{often})"
        if self.whole_host:
            who = f"the {unit}s of host {self.host} ({ranks_named(list(self.ranks), unit)})"
            return (f"{who} hold the others back: their own work takes {figures}, "
                    f"{self._cause_text()}; the other {unit}s spend that time waiting in "
                    f"communication{self._comm_text()}")
        where = f" (host {self.host})" if self.host else ""
        return (f"{unit} {self.ranks[0]}{where} holds the others back: its own work takes "
                f"{figures}, {self._cause_text()}; the other {unit}s spend that time "
                f"waiting in communication{self._comm_text()}")

    def _comm_text(self) -> str:
        """When the collectives themselves cost most of the step and far more than the excess
        (a slow link, large gradients), a word that they hold the job back more."""
        excess = self.own_s - self.others_s
        if not (self.comm_s >= COMM_SHARE * self.step_s and self.comm_s >= COMM_TIMES * excess):
            return ""
        return (f"; communication itself costs more: {_ms(self.comm_s)} of its "
                f"{_ms(self.step_s)} steps, against {_ms(excess)} of this")


def _ms(seconds: float) -> str:
    """``"105 ms"``, ``"15 ms"``, ``"6.7 ms"``, ``"0.35 ms"``."""
    ms = 1000 * seconds
    return f"{ms:.0f} ms" if abs(ms) >= 10 else f"{ms:.2g} ms"


def clock_label(clock: str, on_gpu: bool) -> str:
    """:data:`GPU_TIME` for rows of the GPU's clock, :data:`HOST_TIME` for a GPU rank's host
    clock, else ``""``."""
    return GPU_TIME if clock == "gpu" else HOST_TIME if on_gpu else ""


#: One step's row as the driver keeps it: ``(step_s, input_s, comm_s, cpu_wait_s, cpu_s)``.
Row = tuple[float, float, float, float, float]


def window_parts(rows: list[Row], rhythm: bool = False) -> StepParts:
    """The mean of a window's steps, steps longer than :data:`OUTLIER` times its median left
    out; with ``rhythm``, only when one step is (several are a rhythm of the job: a pipeline
    that makes every third batch late is not a one-off)."""
    limit = OUTLIER * statistics.median(row[0] for row in rows)
    kept = [row for row in rows if row[0] <= limit] or rows
    if rhythm and len(rows) - len(kept) > 1:
        kept = rows
    return StepParts(*(sum(row[i] for row in kept) / len(kept) for i in range(5)))


def _excess(parts: dict[int, StepParts], named: list[int], others: list[int], part: str
            ) -> float:
    base = statistics.median(getattr(parts[r], part) for r in others)
    return min(getattr(parts[r], part) for r in named) - base


def _cause(parts: dict[int, StepParts], named: list[int], others: list[int]) -> str:
    return (INPUT if _excess(parts, named, others, "input_s")
            > _excess(parts, named, others, "compute_s") else COMPUTE)


def _holds_back(parts: dict[int, StepParts], named: list[int], others: list[int],
                share: float, least: float) -> bool:
    base = statistics.median(parts[r].own_s for r in others)
    excess = min(parts[r].own_s for r in named) - base
    waited = statistics.median(parts[r].comm_s for r in others) - max(
        parts[r].comm_s for r in named)
    return (excess >= max(share * base, least) and waited >= WAIT_SHARE * excess)


def look(parts: dict[int, StepParts], hosts: dict[int, str],
         share: float = NAME_SHARE, least: float = MIN_EXCESS_S) -> Straggler | None:
    """The rank, or the ranks of one host, that hold the others back in one window's
    ``parts`` (rank -> mean step), their own work longer than the others' by ``share`` of it;
    ``None`` when none does."""
    if len(parts) < 2:
        return None
    slowest = max(parts, key=lambda r: parts[r].own_s)
    host = hosts.get(slowest, "")
    mates = sorted(r for r in parts if host and hosts.get(r) == host)
    elsewhere = [r for r in parts if r not in mates]
    if len(mates) > 1 and elsewhere and _holds_back(parts, mates, elsewhere, share, least):
        named, others, whole = mates, elsewhere, True
    else:
        named, others, whole = [slowest], [r for r in parts if r != slowest], False
        if not _holds_back(parts, named, others, share, least):
            return None
    ran = statistics.median(parts[r].cpu_s for r in others)
    return Straggler(tuple(named), host, whole, _cause(parts, named, others),
                     statistics.mean(parts[r].own_s for r in named),
                     statistics.median(parts[r].own_s for r in others),
                     max(0.0, _excess(parts, named, others, "cpu_wait_s")),
                     _excess(parts, named, others, "cpu_s"),
                     statistics.median(parts[r].cpu_wait_s for r in others) / ran if ran > 0
                     else 0.0, comm_s=statistics.mean(parts[r].comm_s for r in named),
                     step_s=statistics.mean(parts[r].step_s for r in named))


def _step_excess(window: dict[int, list[Row]], named: tuple[int, ...], every: bool = False
                 ) -> tuple[list[float], list[float]]:
    """Step by step of the ``window``: the others' own work (its median), and how much longer
    ``named``'s was: the longest of theirs, when several (the ranks of a host under a CPU quota
    take turns to wait for a CPU, and the step waits for whichever did), or with ``every`` the
    shortest (each of them late in that step)."""
    others = [r for r in window if r not in named]
    pick = min if every else max
    base, excess = [], []
    for i in range(len(window[named[0]])):
        base.append(statistics.median(window[r][i][0] - window[r][i][2] for r in others))
        excess.append(pick(window[r][i][0] - window[r][i][2] for r in named) - base[-1])
    return base, excess


def longer_steps(window: dict[int, list[Row]], named: tuple[int, ...], share: float,
                 least: float = MIN_EXCESS_S, every: bool = False) -> int:
    """In how many of the ``window``'s steps (rank -> its rows, step by step) ``named``'s own
    work was longer than the others' by half ``share`` of theirs (with ``every``, each of
    theirs; else the longest)."""
    base, excess = _step_excess(window, named, every)
    return sum(e >= max(share * b, least) / 2 for b, e in zip(base, excess))


def steady(window: dict[int, list[Row]], named: tuple[int, ...], share: float,
           least: float = MIN_EXCESS_S, every: bool = False) -> bool:
    """Whether ``named``'s own work was longer than the others' (by half ``share`` of theirs)
    in at least :data:`STEADY_SHARE` of the ``window``'s steps (rank -> its rows, step by step),
    not in a step or two far longer (a busy host's scheduler starving the rank for a tenth of a
    second) that make the window's mean."""
    return (longer_steps(window, named, share, least, every)
            >= STEADY_SHARE * len(window[named[0]]))


def rhythmic(window: dict[int, list[Row]], named: tuple[int, ...], share: float,
             least: float = MIN_EXCESS_S, cycles: int = 2) -> int:
    """The period (in steps, :data:`RHYTHMS`) at which ``named``'s own work was longer than the
    others' in every one of the ``window``'s steps of one phase (at least ``cycles`` of them),
    each by ``share`` of the others' work over the period: a pipeline that makes every third
    batch late holds the others back as surely as one that makes every batch a little late;
    ``0`` when none. Steps starved of a CPU now and then come at no period. The ranks of a host
    must each be late in those steps (their turns at random made a rhythm of noise)."""
    base, excess = _step_excess(window, named, every=True)
    for period in RHYTHMS:
        for phase in range(period):
            late = range(phase, len(base), period)
            if len(late) >= cycles and all(
                    excess[i] >= max(share * period * base[i], least) for i in late):
                return period
    return 0


def _columns(parts: StepParts) -> dict[str, float]:
    """A mean step's columns in the intervals and the rank rows."""
    return {"step_s": parts.step_s, "input_s": parts.input_s, "compute_s": parts.compute_s,
            "comm_s": parts.comm_s, "cpu_wait_s": parts.cpu_wait_s, "cpu_s": parts.cpu_s}


class StepSplits:
    """What the ranks said of their steps, and the straggler verdict drawn from it.

    Attributes
    ----------
    current : Straggler or None
        The rank (or host) holding the others back now.
    events : list of (str, Straggler)
        Each time one was named (``"named"``) or caught up (``"cleared"``), in order.
    intervals : list of dict
        One row per rank's report (a few a second): ``rank``, ``time_s`` (since the job
        began), ``steps`` and the mean ``step_s``, ``input_s``, ``compute_s``, ``comm_s``,
        ``cpu_wait_s``, ``cpu_s`` of those steps.
    """

    def __init__(self, started_at: float | None = None) -> None:
        self.started_at = time.monotonic() if started_at is None else started_at
        self._rows: dict[int, dict[int, Row]] = {}
        self._totals: dict[int, list[float]] = {}
        self._looked = 0
        self._streak: tuple[tuple[int, ...], int] = ((), 0)
        #: How many of the streak's latest looks in a row found its rank in most steps
        #: (:func:`steady`), not only as a rhythm (:func:`rhythmic`).
        self._steady_looks = 0
        self.current: Straggler | None = None
        self.events: list[tuple[str, Straggler]] = []
        self.intervals: list[dict[str, Any]] = []
        #: Rank -> its GPU's latest reading (:mod:`hvd_magics.rank.gpu_memory`), and the
        #: highest peak it reported.
        self.gpu: dict[int, dict[str, Any]] = {}
        #: Rank -> whose clock its rows are: ``"gpu"`` or ``"host"``.
        self.clock: dict[int, str] = {}
        #: Ranks whose CPU time is not read (TensorFlow's: ``cpu_read`` false in their events).
        self.cpu_unread: set[int] = set()

    def observe(self, rank: int, event: dict[str, Any], hosts: dict[int, str]
                ) -> StepParts | None:
        """Take one rank's ``step_split`` event and look again at every step all ranks have
        now reported; the mean of the steps it reported (``None``: none)."""
        self.clock[rank] = event.get("clock") or "host"
        if event.get("cpu_read") is False:
            self.cpu_unread.add(rank)
        if event.get("gpu"):
            peak = max(event["gpu"].get("peak") or 0, self.gpu.get(rank, {}).get("peak") or 0)
            self.gpu[rank] = {**event["gpu"], "peak": peak}
        rows = self._rows.setdefault(rank, {})
        for step, *columns in event.get("rows") or []:
            rows[int(step)] = tuple(float(v) for v in (columns + [0.0, 0.0])[:5])
        for old in sorted(rows)[:-KEPT_STEPS]:
            del rows[old]
        parts = None
        count, *sums = (list(event.get("totals") or [0]) + [0.0] * 5)[:6]
        if count:
            totals = self._totals.setdefault(rank, [0, 0.0, 0.0, 0.0, 0.0, 0.0])
            for i, value in enumerate([count, *sums]):
                totals[i] += value
            parts = StepParts(*(value / count for value in sums))
            self.intervals.append({
                "rank": rank, "time_s": round(event.get("recv", time.monotonic())
                                              - self.started_at, 3),
                "steps": int(count), **_columns(parts)})
        self._look_up_to(hosts)
        return parts

    def _look_up_to(self, hosts: dict[int, str]) -> None:
        if len(self._rows) < 2 or not all(self._rows.values()):
            return
        reported = min(max(rows) for rows in self._rows.values())
        first = max(self._looked + 1, reported - KEPT_STEPS + WINDOW_STEPS)
        stride = max(1, -(-(reported + 1 - first) // LOOKS_PER_REPORT))
        for step in range(first, reported + 1, stride):
            steps = range(step - WINDOW_STEPS + 1, step + 1)
            if all(all(s in rows for s in steps) for rows in self._rows.values()):
                window = {rank: [rows[s] for s in steps] for rank, rows in self._rows.items()}
                self._judge(hosts, step, window)
        self._looked = max(self._looked, reported)

    def _find(self, hosts: dict[int, str], window: dict[int, list[Row]], share: float
              ) -> tuple[Straggler | None, bool]:
        """The rank (or host) one look at ``window`` finds, and whether only as a rhythm:
        longer in most steps, a long step now and then left out of the mean (:func:`steady`),
        or late in every step of one phase, its long steps kept (:func:`rhythmic`)."""
        least = self._least()
        found = look({rank: window_parts(w) for rank, w in window.items()}, hosts, share, least)
        if found is not None and steady(window, found.ranks, share, least):
            return found, False
        found = look({rank: window_parts(w, rhythm=True) for rank, w in window.items()}, hosts,
                     share, least)
        if found is not None and rhythmic(window, found.ranks, share, least):
            return found, True
        return None, False

    def _judge(self, hosts: dict[int, str], step: int, window: dict[int, list[Row]]) -> None:
        share = CLEAR_SHARE if self.current is not None else NAME_SHARE
        found, by_rhythm = self._find(hosts, window, share)
        key = found.ranks if found is not None else ()
        if self.current is not None and key == self.current.ranks:
            self._streak, self._steady_looks = ((), 0), 0
            return
        ranks, count = self._streak
        self._streak = (key, count + 1 if key == ranks else 1)
        self._steady_looks = 0 if by_rhythm else (
            self._steady_looks + 1 if key == ranks else 1)
        if self._streak[1] < LOOKS_TO_NAME:
            return
        if self.current is not None:
            self.events.append(("cleared", dataclasses.replace(self.current, step=step)))
            self.current = None
        if found is not None:
            streak = self._streak_window(step)
            if streak is not None and not self._shown_by(streak, found.ranks, share):
                return  # not through the streak's steps (yet): the streak goes on
            found = self._over_the_streak(found, hosts, share, streak)
            known = all(self.clock.get(r, "host") == "host" and r not in self.gpu
                        and (self._totals.get(r) or [0] * 6)[5] > 0 for r in window)
            read = not any(r in self.cpu_unread for r in window)
            self.current = dataclasses.replace(found, step=step, cpu_known=known, cpu_read=read)
            self.events.append(("named", self.current))
        self._streak, self._steady_looks = ((), 0), 0

    def _shown_by(self, streak: dict[int, list[Row]], ranks: tuple[int, ...], share: float
                  ) -> bool:
        """Whether the steps of the looks that would name ``ranks`` show them too: at a period
        through them when some of those looks found them as a rhythm; one of a host's ranks
        longer in :data:`TURNS_SHARE` of them when they were seldom longer together (a host's
        ranks late in turns at random, in 4 of 8 steps in one look after another, were named);
        else as the looks found them, with nothing more asked."""
        least = self._least()
        if self._rhythm:
            return bool(rhythmic(streak, ranks, share, least, cycles=STREAK_CYCLES))
        if len(ranks) > 1 and not steady(streak, ranks, share, least, every=True):
            return longer_steps(streak, ranks, share, least) >= TURNS_SHARE * len(streak[ranks[0]])
        return True

    @property
    def _rhythm(self) -> bool:
        """Whether the looks that would name the streak's rank found it as a rhythm: not all of
        the latest :data:`LOOKS_TO_NAME` in most steps (those name it as they always did)."""
        return self._steady_looks < LOOKS_TO_NAME

    def _streak_window(self, step: int) -> dict[int, list[Row]] | None:
        """Every rank's rows of the steps the looks up to ``step`` that name a rank read
        together (:data:`STREAK_STEPS`); ``None`` when a rank lacks some."""
        steps = range(step - STREAK_STEPS + 1, step + 1)
        if not all(all(s in rows for s in steps) for rows in self._rows.values()):
            return None
        return {rank: [rows[s] for s in steps] for rank, rows in self._rows.items()}

    def _over_the_streak(self, found: Straggler, hosts: dict[int, str], share: float,
                         streak: dict[int, list[Row]] | None) -> Straggler:
        """``found`` judged again over every step its looks read (``streak``,
        :meth:`_streak_window`): its cause and figures from twice the steps one look reads, so
        that a busy host's noise in one window does not make the cause (``found``, when a rank
        lacks those steps or the longer look finds another), and, for a rhythm, in how many of
        them its own work was longer."""
        if streak is None:
            return found
        longer = look({rank: window_parts(rows, rhythm=self._rhythm)
                       for rank, rows in streak.items()}, hosts, share, self._least())
        if longer is None or longer.ranks != found.ranks:
            return found
        if not self._rhythm:
            return longer
        return dataclasses.replace(longer, longer_in=(
            longer_steps(streak, found.ranks, share, self._least()), STREAK_STEPS))

    def _least(self) -> float:
        """The least excess a step that names a rank: :data:`MIN_EXCESS_UNREAD_S` when a
        rank's CPU time is not read."""
        return MIN_EXCESS_UNREAD_S if self.cpu_unread else MIN_EXCESS_S

    def per_rank(self) -> dict[int, StepParts]:
        """Each rank's mean step over the whole job."""
        return {rank: StepParts(*(value / t[0] for value in t[1:]))
                for rank, t in sorted(self._totals.items()) if t[0]}

    def steps_of(self, rank: int) -> int:
        """How many steps ``rank`` reported."""
        return int(self._totals.get(rank, [0])[0])

    def latest(self, rank: int, rhythm: bool = True) -> StepParts | None:
        """``rank``'s mean step over its latest window, as the dashboard shows it: a single
        step far longer than the others left out, several kept (:func:`window_parts`; the
        looks leave them out, ``rhythm`` false). A rank whose every third step waited 40 ms for
        its input showed no wait at all."""
        rows = self._rows.get(rank)
        if not rows:
            return None
        return window_parts([rows[s] for s in sorted(rows)[-WINDOW_STEPS:]], rhythm)

    def comm_bound(self, share: float) -> float | None:
        """The least share of its latest steps any rank spent in communication, when every
        rank (of at least two) spent at least ``share`` and no rank is named; else ``None``."""
        if self.current is not None or len(self._rows) < 2:
            return None
        latest = [self.latest(rank, rhythm=False) for rank in self._rows]
        if any(p is None or p.step_s <= 0 for p in latest):
            return None
        least = min(p.comm_s / p.step_s for p in latest if p is not None)
        return least if least >= share else None

    def now(self, unit: str = "rank") -> str:
        """The verdict on the rank (or host) holding the others back now, ``""`` when none."""
        return self.current.text(unit) if self.current is not None else ""

    def rank_rows(self, hosts: dict[int, str]) -> list[dict[str, Any]]:
        """Per rank: ``rank``, ``host``, ``steps`` and the mean ``step_s``, ``input_s``,
        ``compute_s``, ``comm_s``, ``cpu_wait_s``, ``cpu_s`` over the job."""
        return [{"rank": rank, "host": hosts.get(rank, ""), "steps": self.steps_of(rank),
                 **_columns(parts), "clock": self.clock.get(rank, "host"),
                 **({"gpu_peak_bytes": self.gpu[rank]["peak"]} if rank in self.gpu else {})}
                for rank, parts in self.per_rank().items()]

    def clock_of(self, rank: int) -> str:
        """What ``rank``'s shares are prefixed with: :data:`GPU_TIME`, :data:`HOST_TIME` on a
        GPU rank timed by its host, else ``""``."""
        return clock_label(self.clock.get(rank, "host"), rank in self.gpu)

    def gpu_text(self, rank: int) -> str:
        """``"GPU 3.1/80 GB (peak 4.0), 97% busy"``, ``""`` on a rank without a GPU."""
        gpu = self.gpu.get(rank)
        if not gpu:
            return ""
        gb = 1024 ** 3
        busy = f", {gpu['util']}% busy" if gpu.get("util") is not None else ""
        return (f"GPU {gpu['used'] / gb:.1f}/{gpu['total'] / gb:.0f} GB "
                f"(peak {gpu['peak'] / gb:.1f}){busy}")

    def verdicts(self, unit: str = "rank") -> list[str]:
        """What was found, one line per rank (or host) named: its verdict, the step it was
        named at and, once it caught up, that step."""
        lines: list[str] = []
        for what, found in self.events:
            if what == "named":
                lines.append(f"from step {found.step}: {found.text(unit)}")
            elif lines:
                lines[-1] += f" (caught up by step {found.step})"
        return lines
