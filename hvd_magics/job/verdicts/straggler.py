"""Which rank holds the others back, and why: the driver's reading of the ranks' step splits.

Each rank sends its steps' time split into input, compute and communication
(:mod:`hvd_magics.rank.instruments.step_split`). In data-parallel training every rank's step lasts
as long as the slowest rank's: the ranks differ in how they spend it. A rank whose own work (input
and compute) is longer than the others' while they wait for it in communication holds them back.

Who holds the others back is read from what they lose
(:mod:`hvd_magics.job.verdicts.wait_accounting`): in each step, the time the slowest rank's own work
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
import statistics
import time
from dataclasses import dataclass
from typing import Any, cast

from hvd_magics.common.sizes import byte_size
from hvd_magics.job.verdicts.wait_accounting import (COST_SHARE, SIGNIFICANCE, Finding, Row,
                                                     StepDelay, accuse, binomial_tail,
                                                     step_delay)
from hvd_magics.protocol import STEP_COLUMNS
from hvd_magics.rank_names import ranks_named

#: The windows (steps) a look reads, shortest first: a rank slowed from a step on is named
#: over the first, a stall every tenth step over the second, one every fiftieth over the last.
WINDOWS = (15, 60, 240)
#: The steps the dashboard's bar of a rank reads.
WINDOW_STEPS = 8
#: A verdict that the rank was longer "in N of its last M steps" is given when that is under
#: this share of them.
STEADY_SHARE = 0.5
#: How much longer (a share of the others' own work) a rank's own work must be than theirs to be
#: named, and below which it is cleared.
NAME_SHARE = 0.08
#: ...and how much longer on average over the window that names it a slowdown must be (a
#: verdict kept while it holds too): equal ranks of 30 ms of work a step, beside 0-2 busy
#: processes, differed by 8-10% for seconds on end (named in 2 of 14 recorded runs), and a
#: verdict kept said "1% longer".
VERDICT_SHARE = 0.15
#: A named rank is cleared when the others lose less than this share of the latest steps' time
#: to it (half what names it: :data:`hvd_magics.job.verdicts.wait_accounting.COST_SHARE`).
CLEAR_SHARE = COST_SHARE / 2
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
KEPT_STEPS = 2304
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
#: ...and the most looks one report leads to (with more new steps, every n-th step is looked
#: at: a job of many short steps costs the driver little).
LOOKS_PER_REPORT = 64
#: What a GPU rank's split is prefixed with: its clock is the host thread's (the GPU's kernels
#: run asynchronously; where the thread waits for them is where their time shows).
HOST_TIME = "host time: "
#: ...and a DDP rank's on a CUDA device, timed by the GPU's own events
#: (rank/instruments/gpu_steps.py).
GPU_TIME = "GPU time: "
#: Of a compute excess, the least share of waiting for a CPU that makes it "waiting for a CPU",
#: and the most share of running on one longer than the others (more work runs longer, even
#: on a CPU that other threads share with it).
CPU_WAIT_SHARE = 0.5
CPU_RAN_SHARE = 0.25
#: A rank's own work longer than the others' is its CPU's condition, not its work, when the
#: CPU it runs on ran the rank's pace probes (rank/instruments/step_split.py) slower than the
#: others' by at least this share of its excess (equal ranks beside a busy process: own work
#: 24-45% longer over 60 steps of 1 ms, the probe 36-62% slower with it)...
PACE_SHARE = 0.5
#: ...read over at least this many probes of each rank (the window's, or the latest before
#: its end when it holds fewer).
PACE_PROBES = 3
#: A verdict says that communication costs more than the rank's excess when the rank's own
#: time in collectives is at least this share of its step and this many times the excess (the
#: slow-link test named a rank 1.2 ms a step longer in its own work while its steps spent
#: about 100 ms in collectives).
COMM_SHARE = 0.5
COMM_TIMES = 2.0
#: The causes a verdict names.
INPUT, COMPUTE = "input", "compute"
_PART = {INPUT: "in its input pipeline", COMPUTE: "in compute"}
#: A part's columns of :class:`StepParts`: its time, its wait for a CPU, its time on one.
_PART_COLUMNS = {INPUT: ("input_s", "input_cpu_wait_s", "input_cpu_s"),
                 COMPUTE: ("compute_s", "compute_cpu_wait_s", "compute_cpu_s")}
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
    one, in its own work; ``input_cpu_wait_s`` and ``input_cpu_s``: of those, in its input)."""

    step_s: float
    input_s: float
    comm_s: float
    cpu_wait_s: float = 0.0
    cpu_s: float = 0.0
    input_cpu_wait_s: float = 0.0
    input_cpu_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.input_s - self.comm_s)

    @property
    def compute_cpu_wait_s(self) -> float:
        return max(0.0, self.cpu_wait_s - self.input_cpu_wait_s)

    @property
    def compute_cpu_s(self) -> float:
        return max(0.0, self.cpu_s - self.input_cpu_s)

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
    difference in ``cause`` (longer than the others' by ``part_s``); in that part ``cpu_wait_s``
    longer waiting for a CPU per step than the others, ``cpu_s`` longer on one; named at step
    ``step``."""

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
    #: How much longer its ``cause`` part is than the others' per step (``None``: its whole
    #: own work's excess), and its wait for a CPU beyond theirs in the other part
    #: (:attr:`starved_s`'s measure).
    part_s: float | None = None
    elsewhere_starved_s: float = 0.0
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
    #: The share of the job's time the others lost waiting for it over the latest ``lost_steps``
    #: steps (``0``: not measured).
    lost_share: float = 0.0
    lost_steps: int = 0

    @property
    def excess_s(self) -> float:
        """How much longer than the others' per step its cause's part is."""
        return self.own_s - self.others_s if self.part_s is None else self.part_s

    @property
    def more_work_s(self) -> float:
        """Of its excess per step, what more time on a CPU explains, with the wait for a CPU
        every rank has per second on one (more work on a busy host waits in proportion)."""
        return self.cpu_s * (1 + self.wait_ratio)

    @property
    def starved_s(self) -> float:
        """Of its excess per step, its wait for a CPU beyond the others' in proportion to its
        time on one: a CPU it got less of than they did."""
        return _starved(self.cpu_wait_s, self.cpu_s, self.wait_ratio)

    @property
    def waits_for_cpu(self) -> bool:
        """Whether its excess is mostly waiting for a CPU, not more work or slower input (more
        work runs longer on a CPU, and waits for one as long as the others' work does)."""
        excess = self.excess_s
        return (excess > 0 and self.starved_s >= CPU_WAIT_SHARE * excess
                and self.more_work_s <= CPU_RAN_SHARE * excess)

    @property
    def off_cpu(self) -> bool:
        """Whether its compute excess is mostly time its thread neither ran nor waited for a
        CPU (a sleep, a file read, a lock): not forward and backward."""
        excess = self.excess_s
        return (self.cpu_known and self.cause == COMPUTE and excess > 0
                and self.more_work_s <= CPU_RAN_SHARE * excess
                and self.starved_s < CPU_WAIT_SHARE * excess)

    @property
    def partly_waits_for_cpu(self) -> bool:
        """Whether a good part of its excess (:data:`CPU_RAN_SHARE`) is waiting for a CPU
        beyond the others' and as good a part more time on one: both are said. (A rank that
        sleeps for its batches waits for a CPU each time it wakes, and ran no longer: it was
        said to run "-1.1 ms" longer.)"""
        excess = self.excess_s
        return (self.cpu_read and excess > 0 and self.starved_s >= CPU_RAN_SHARE * excess
                and self.more_work_s >= CPU_RAN_SHARE * excess and not self.waits_for_cpu)

    def _cause_text(self) -> str:
        return self._part_text() + self._elsewhere_text()

    def _elsewhere_text(self) -> str:
        """Its wait for a CPU beyond the others' in the part that is not its cause, when it is
        a good part of its excess (:data:`CPU_RAN_SHARE`)."""
        if (self.elsewhere_starved_s <= 0
                or self.elsewhere_starved_s < CPU_RAN_SHARE * (self.own_s - self.others_s)):
            return ""
        other = COMPUTE if self.cause == INPUT else INPUT
        return (f"; besides, {_ms(self.elsewhere_starved_s)} a step waiting for a CPU beyond "
                f"the others' {_PART[other]} {_CPU_WAIT_WHY}")

    def _part_text(self) -> str:
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
        spend = (f"lose {100 * self.lost_share:.0f}% of the job's time over its last "
                 f"{self.lost_steps} steps to {'them' if self.whole_host else 'it'}, waiting in "
                 f"communication" if self.lost_steps else
                 "spend that time waiting in communication")
        if self.whole_host:
            who = f"the {unit}s of host {self.host} ({ranks_named(list(self.ranks), unit)})"
            return (f"{who} hold the others back: their own work takes {figures}, "
                    f"{self._cause_text()}; the other {unit}s {spend}{self._comm_text()}")
        where = f" (host {self.host})" if self.host else ""
        return (f"{unit} {self.ranks[0]}{where} holds the others back: its own work takes "
                f"{figures}, {self._cause_text()}; the other {unit}s {spend}"
                f"{self._comm_text()}")


    def _comm_text(self) -> str:
        """When the collectives themselves cost most of the step and far more than the excess
        (a slow link, large gradients), a word that they hold the job back more."""
        excess = self.own_s - self.others_s
        if not (self.comm_s >= COMM_SHARE * self.step_s and self.comm_s >= COMM_TIMES * excess):
            return ""
        return (f"; communication itself costs more: {_ms(self.comm_s)} of its "
                f"{_ms(self.step_s)} steps, against {_ms(excess)} of this")


@dataclass(frozen=True)
class BusyHosts:
    """A condition, not a verdict on a rank: the ranks of ``hosts`` waited for a CPU (ready to
    run, not running) beyond one another, and the others waited for them in turn, for
    ``share`` of the job's time over its latest ``steps`` steps; said once, at ``step``."""

    hosts: tuple[str, ...]
    share: float
    steps: int
    step: int = 0
    #: When said for a CPU that ran the same work slower: the ranks whose own work was longer
    #: by ``longer`` (a share of the others') while their CPU ran its pace probe ``slower``.
    ranks: tuple[int, ...] = ()
    longer: float = 0.0
    slower: float = 0.0

    def text(self, unit: str = "rank") -> str:
        named = [h for h in self.hosts if h]
        where = (f"host {named[0]}'s CPUs are" if len(named) == 1 else
                 f"the CPUs of hosts {', '.join(named)} are" if named else "the CPUs are")
        if self.ranks:
            return (f"{where} busy (other work, more {unit}s than CPUs, or a CPU quota): "
                    f"{ranks_named(list(self.ranks), unit)}'s own work took "
                    f"{100 * self.longer:.0f}% longer per step than the others' over its last "
                    f"{self.steps} steps while its CPU ran the same fixed work "
                    f"{100 * self.slower:.0f}% slower than theirs (it shares that CPU with "
                    f"other work): that is the host's condition, no {unit} is named for it")
        return (f"{where} busy (other work, more {unit}s than CPUs, or a CPU quota): the "
                f"{unit}s waiting for a CPU beyond one another cost {100 * self.share:.0f}% of "
                f"the job's time over its last {self.steps} steps, the others waiting for them; "
                f"that is the host's condition, no {unit} is named for it")


def _ms(seconds: float) -> str:
    """``"105 ms"``, ``"15 ms"``, ``"6.7 ms"``, ``"0.35 ms"``."""
    ms = 1000 * seconds
    return f"{ms:.0f} ms" if abs(ms) >= 10 else f"{ms:.2g} ms"


def clock_label(clock: str, on_gpu: bool) -> str:
    """:data:`GPU_TIME` for rows of the GPU's clock, :data:`HOST_TIME` for a GPU rank's host
    clock, else ``""``."""
    return GPU_TIME if clock == "gpu" else HOST_TIME if on_gpu else ""


def window_parts(rows: list[Row], rhythm: bool = False, keep_all: bool = False) -> StepParts:
    """The mean of a window's steps, steps longer than :data:`OUTLIER` times its median left
    out; with ``rhythm``, only when one step is (several are a rhythm of the job: a pipeline
    that makes every third batch late is not a one-off); with ``keep_all``, none."""
    limit = OUTLIER * statistics.median(row[0] for row in rows)
    kept = [row for row in rows if row[0] <= limit] or rows
    if keep_all or (rhythm and len(rows) - len(kept) > 1):
        kept = rows
    return StepParts(*(sum(row[i] for row in kept) / len(kept)
                       for i in range(len(STEP_COLUMNS))))


def _excess(parts: dict[int, StepParts], named: list[int], others: list[int], part: str
            ) -> float:
    base = statistics.median(getattr(parts[r], part) for r in others)
    return min(getattr(parts[r], part) for r in named) - base


def _starved(waited_s: float, ran_s: float, wait_ratio: float) -> float:
    """Of a wait for a CPU ``waited_s`` beyond the others', what their own wait per second on
    one (``wait_ratio``) does not explain for the ``ran_s`` longer it ran on one."""
    return waited_s - wait_ratio * ran_s


@dataclass(frozen=True)
class _PartExcess:
    """How much longer one part (input or compute) of the named ranks' step is than the
    others', and in it their wait for a CPU and their time on one beyond the others'."""

    part_s: float
    waited_s: float
    ran_s: float

    def starved_s(self, wait_ratio: float) -> float:
        """Its wait for a CPU beyond the others' that its longer time on one does not explain
        (``0`` or more)."""
        return max(0.0, _starved(self.waited_s, self.ran_s, wait_ratio))

    def net_s(self, wait_ratio: float) -> float:
        """The part's excess without its wait for a CPU beyond the others' (what names a
        rank: its own work net of that wait)."""
        return self.part_s - self.starved_s(wait_ratio)


def _part_excess(parts: dict[int, StepParts], named: list[int], others: list[int],
                 cause: str) -> _PartExcess:
    return _PartExcess(*(_excess(parts, named, others, column)
                         for column in _PART_COLUMNS[cause]))


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
    return verdict(parts, hosts, named, whole)


def _input_is_the_cause(found: _PartExcess, other: _PartExcess, ratio: float, excess_s: float,
                        by_net: bool) -> bool:
    """Whether the input part (``found``), not compute (``other``), is the cause of an own
    work ``excess_s`` longer than the others': the part longer net of its wait for a CPU
    (what names a rank), when that is a good part of the excess (:data:`CPU_RAN_SHARE`) and
    ``by_net``; otherwise the part longer as it is (an excess that is all a wait for a CPU
    nets to about nothing in both parts, and a tenth of a millisecond chose the cause)."""
    net_input, net_compute = found.net_s(ratio), other.net_s(ratio)
    if by_net and max(net_input, net_compute) >= CPU_RAN_SHARE * excess_s:
        return net_input > net_compute
    return found.part_s > other.part_s


def verdict(parts: dict[int, StepParts], hosts: dict[int, str], named: list[int],
            whole: bool, by_net: bool = True) -> Straggler:
    """The verdict on ``named`` (a rank, or the ranks of one host when ``whole``) from a
    window's ``parts`` (rank -> mean step): its cause and figures against the other ranks'.
    The cause is chosen net of the ranks' waits for a CPU when ``by_net`` (their host clock
    times both parts: not a GPU's)."""
    others = [r for r in parts if r not in named]
    host = hosts.get(named[0], "")
    ran = statistics.median(parts[r].cpu_s for r in others)
    ratio = statistics.median(parts[r].cpu_wait_s for r in others) / ran if ran > 0 else 0.0
    own_s = statistics.mean(parts[r].own_s for r in named)
    others_s = statistics.median(parts[r].own_s for r in others)
    found = _part_excess(parts, named, others, INPUT)
    other = _part_excess(parts, named, others, COMPUTE)
    cause = INPUT
    if not _input_is_the_cause(found, other, ratio, own_s - others_s, by_net):
        found, other, cause = other, found, COMPUTE
    return Straggler(tuple(named), host, whole, cause, own_s, others_s,
                     max(0.0, found.waited_s), found.ran_s, ratio, part_s=found.part_s,
                     elsewhere_starved_s=other.starved_s(ratio),
                     comm_s=statistics.mean(parts[r].comm_s for r in named),
                     step_s=statistics.mean(parts[r].step_s for r in named))


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
    events : list of (str, Straggler or BusyHosts)
        Each time one was named (``"named"``) or caught up (``"cleared"``), and when the hosts
        were found busy with other work (``"busy"``), in order.
    intervals : list of dict
        One row per rank's report (a few a second): ``rank``, ``time_s`` (since the job
        began), ``steps`` and the mean ``step_s``, ``input_s``, ``compute_s``, ``comm_s``,
        ``cpu_wait_s``, ``cpu_s`` of those steps.
    """

    def __init__(self, started_at: float | None = None, ranks: int | None = None) -> None:
        self.started_at = time.monotonic() if started_at is None else started_at
        #: The job's ranks, when known: no step is judged before every one of them reported.
        self.ranks = ranks
        self._rows: dict[int, dict[int, Row]] = {}
        self._totals: dict[int, list[float]] = {}
        self._looked = 0
        #: Step -> who delayed it, by how much (every rank's row of it read), and the ranks
        #: whose rows those were.
        self._delays: dict[int, StepDelay] = {}
        self._delayed_ranks: set[int] = set()
        #: The named rank(s), whether as their host, what named them, and how they delay the
        #: others ("own": their own work; "cpu": their wait for a CPU).
        self._named: tuple[tuple[int, ...], bool, Finding[int] | Finding[str], str] | None = None
        #: The step its verdict was last cleared at.
        self._since = 0
        self.current: Straggler | None = None
        #: The hosts' condition, said once: busy with other work (:class:`BusyHosts`).
        self.busy: BusyHosts | None = None
        #: Whether the latest look found the hosts so (the live line says it only then).
        self.busy_now = False
        self.events: list[tuple[str, Straggler | BusyHosts]] = []
        self.intervals: list[dict[str, Any]] = []
        #: Rank -> its GPU's latest reading (:mod:`hvd_magics.rank.instruments.gpu_memory`), and the
        #: highest peak it reported.
        self.gpu: dict[int, dict[str, Any]] = {}
        #: Rank -> its host memory's latest reading
        #: (:mod:`hvd_magics.rank.instruments.rank_memory`), with the highest peak it reported.
        self.memory: dict[int, dict[str, Any]] = {}
        #: Rank -> whose clock its rows are: ``"gpu"`` or ``"host"``.
        self.clock: dict[int, str] = {}
        #: Ranks whose CPU time is not read (TensorFlow's: ``cpu_read`` false in their events).
        self.cpu_unread: set[int] = set()
        #: Rank -> step -> seconds of its CPU pace probe after that step.
        self._paces: dict[int, dict[int, float]] = {}

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
        if event.get("memory"):
            peak = max(event["memory"].get("peak") or 0,
                       self.memory.get(rank, {}).get("peak") or 0)
            self.memory[rank] = {**event["memory"], "peak": peak}
        rows, width = self._rows.setdefault(rank, {}), len(STEP_COLUMNS)
        for step, *columns in event.get("rows") or []:
            rows[int(step)] = cast(Row, tuple(float(v) for v in (columns + [0.0] * width)[:width]))
        for old in sorted(rows)[:-KEPT_STEPS]:
            del rows[old]
        paces = self._paces.setdefault(rank, {})
        for step, seconds in event.get("pace") or []:
            if float(seconds) > 0:
                paces[int(step)] = float(seconds)
        for old in sorted(paces)[:-KEPT_STEPS]:
            del paces[old]
        parts = None
        count, *sums = (list(event.get("totals") or [0]) + [0.0] * width)[:width + 1]
        if count:
            totals = self._totals.setdefault(rank, [0] + [0.0] * width)
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
        if len(self._rows) < max(2, self.ranks or 0) or not all(self._rows.values()):
            return
        if set(self._rows) != self._delayed_ranks:  # a rank reported late: its steps count
            self._delays.clear()
            self._delayed_ranks = set(self._rows)
        reported = min(max(rows) for rows in self._rows.values())
        read = not self.cpu_unread
        # every step up to the reported one that all ranks have now (a rank's row of a step
        # may come after the others' of later steps: a stall's step was missing from the looks)
        for step in range(max(1, reported - KEPT_STEPS + 1), reported + 1):
            if step not in self._delays and all(step in rows for rows in self._rows.values()):
                self._delays[step] = step_delay(
                    step, {rank: rows[step] for rank, rows in self._rows.items()}, hosts, read)
        kept = max(min(rows) for rows in self._rows.values())  # every rank still has its row
        for old in [s for s in self._delays if s <= reported - KEPT_STEPS or s < kept]:
            del self._delays[old]
        first = max(self._looked + 1, reported - KEPT_STEPS + WINDOWS[0])
        stride = max(1, -(-(reported + 1 - first) // LOOKS_PER_REPORT))
        for step in range(first, reported + 1, stride):
            self._judge(hosts, step)
        self._looked = max(self._looked, reported)

    def _recent(self, step: int, steps: int) -> list[StepDelay]:
        """The delays of the latest ``steps`` steps up to ``step`` that every rank reported,
        since the last verdict was cleared (what named it is no evidence after that)."""
        return [self._delays[s] for s in range(max(step - steps, self._since) + 1, step + 1)
                if s in self._delays]

    def _evidence_s(self, hosts: dict[int, str], step: int, window: list[StepDelay],
                    found: tuple[list[int], bool, Finding[int] | Finding[str], str]) -> float:
        """How long the slowdown ``found`` over the ``window`` must have lasted to be named:
        :data:`EVIDENCE_S`, or nothing for an excess of :data:`LARGE_EXCESS` or more net of
        the rank's wait for a CPU beyond the others' (no busy CPU was seen to double a rank's
        own work but by that wait)."""
        named, whole, finding, kind = found
        self._named = (tuple(named), whole, finding, kind)
        try:
            seen = self._verdict(hosts, step, window)
        finally:
            self._named = None
        net = seen.own_s - seen.cpu_wait_s
        return 0.0 if seen.others_s > 0 and net >= (1 + LARGE_EXCESS) * seen.others_s \
            else EVIDENCE_S

    def _lasting(self, step: int, steps: int, need_s: float) -> list[StepDelay]:
        """:meth:`_recent`'s window, taken back over as many steps as span ``need_s``
        seconds (at most :data:`LASTING_STEPS`); empty when the steps kept since the last
        verdict was cleared do not reach that far yet."""
        window = self._recent(step, steps)
        wall = sum(d.wall_s for d in window)
        if wall >= need_s or len(window) >= LASTING_STEPS:
            return window
        earlier: list[StepDelay] = []
        for s in range(step - steps, self._since, -1):
            d = self._delays.get(s)
            if d is None:
                continue
            earlier.append(d)
            wall += d.wall_s
            if wall >= need_s or len(window) + len(earlier) >= LASTING_STEPS:
                return earlier[::-1] + window
        return []

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
            found = self._accuse(hosts, window)
            if found is not None and not found[2].period:
                # a slowdown, not a rhythm or a periodic stall: named once it lasted
                need = self._evidence_s(hosts, step, window, found)
                if sum(d.wall_s for d in window) < need:
                    window = self._lasting(step, steps, need)
                    found = self._accuse(hosts, window) if window else None
            if found is not None:
                named, whole, finding, kind = found
                self._named = (tuple(named), whole, finding, kind)
                candidate = self._verdict(hosts, step, window)
                slower = self._cpu_slower(candidate, window)
                if not self._borne_out(candidate) or slower is not None:
                    self._named = None
                    if slower is not None:
                        self._slowed(candidate, slower, len(window), step)
                    continue
                self.current = candidate
                self.events.append(("named", self.current))
                return
        self._busy(hosts, step)

    def _chances(self, hosts: dict[int, str]) -> tuple[dict[int, float], dict[str, float]]:
        """Each rank's, and each host's, chance to be the slowest of a step on equal ranks."""
        ranks = list(self._rows)
        by_host: dict[str, float] = {}
        for rank in ranks:
            by_host[hosts.get(rank, "")] = by_host.get(hosts.get(rank, ""), 0.0) + 1 / len(ranks)
        return {rank: 1 / len(ranks) for rank in ranks}, by_host

    def _accuse(self, hosts: dict[int, str], window: list[StepDelay]
                ) -> tuple[list[int], bool, Finding[int] | Finding[str], str] | None:
        """Who the ``window``'s lost time is owed to (:func:`accuse`): a rank, or every rank of
        a host (when no one of them accounts for most of the host's), for its own work; on
        several hosts, a host for its ranks' wait for a CPU. ``(ranks, whole host, finding,
        "own" or "cpu")``; ``None`` when nobody."""
        least, (by_rank, by_host) = self._least(), self._chances(hosts)
        several = len(by_host) > 1
        rank = accuse(window, lambda d: (d.rank, d.own_s), by_rank, least, NAME_SHARE)
        host = accuse(window, lambda d: (d.host, d.host_own_s), by_host, least,
                      NAME_SHARE) if several else None
        alone = rank is not None and (not several or self._alone(hosts, window, int(rank.who)))
        if host is not None:
            mates = sorted(r for r in self._rows if hosts.get(r, "") == host.who)
            if len(mates) > 1 and not (alone and rank is not None and rank.who in mates):
                return mates, True, host, "own"
        if rank is not None and alone:
            return [int(rank.who)], False, rank, "own"
        if not several:
            return None
        host = accuse(window, lambda d: (d.host, d.host_cpu_s), by_host, least, NAME_SHARE)
        if host is None:
            return None
        mates = sorted(r for r in self._rows if hosts.get(r, "") == host.who)
        return mates, len(mates) > 1, host, "cpu"

    def _alone(self, hosts: dict[int, str], window: list[StepDelay], rank: int) -> bool:
        """Whether ``rank`` delayed the others beyond chance among its host's ranks, when it
        has host mates: under a CPU quota they take turns to be late, and one of them, late in
        11 of its host's 13 late steps by chance, was named before the host was."""
        host = hosts.get(rank, "")
        mates = [r for r in self._rows if hosts.get(r, "") == host]
        if len(mates) < 2:
            return True
        least = self._least()
        late = [d for d in window if d.host == host
                and d.host_own_s >= max(least, NAME_SHARE * d.base_s)]
        mine = sum(1 for d in late if d.rank == rank)
        return binomial_tail(mine, len(late), 1 / len(mates)) <= SIGNIFICANCE

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
        if not self._borne_out(fresh) or self._cpu_slower(fresh, window) is not None:
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
        # every rank still has its row of each step judged (_look_up_to drops the others)
        parts = {rank: window_parts([rows[d.step] for d in window], keep_all=True)
                 for rank, rows in self._rows.items()}
        mine, _ = self._lost_to(window)
        wall = sum(d.wall_s for d in window)
        host_clock = all(self.clock.get(r, "host") == "host" and r not in self.gpu
                         for r in self._rows)
        found = verdict(parts, hosts, list(ranks), whole, by_net=host_clock)
        least = self._least()
        delayed = sum(1 for d in window if d.rank in ranks
                      and d.own_s + d.cpu_s >= max(least, NAME_SHARE * d.base_s))
        known = host_clock and all((self._totals.get(r) or [0] * 6)[5] > 0  # its cpu_s
                                   for r in self._rows)
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

    def _pace(self, rank: int, window: list[StepDelay]) -> float | None:
        """The median of ``rank``'s CPU pace probes over the ``window``'s steps (or its latest
        :data:`PACE_PROBES` up to the window's end, when it holds fewer); ``None``: none."""
        paces = self._paces.get(rank) or {}
        first, last = window[0].step, window[-1].step
        inside = [v for s, v in paces.items() if first <= s <= last]
        if len(inside) < PACE_PROBES:
            inside = [paces[s] for s in sorted(s for s in paces if s <= last)[-PACE_PROBES:]]
        return statistics.median(inside) if len(inside) >= PACE_PROBES else None

    def _cpu_slower(self, found: Straggler, window: list[StepDelay]) -> float | None:
        """How much slower (a share) the named ranks' CPU ran its pace probes than the
        others' over the ``window``, when that explains :data:`PACE_SHARE` of their longer own
        work or more and it is longer in compute (their CPU's condition, not their work: a
        rank that sleeps for its batches wakes on a CPU slower for a while); ``None`` when it
        does not, or when the probes are not there (GPU ranks, TensorFlow's)."""
        if found.cause != COMPUTE:  # a wait for batches is not run on a CPU
            return None
        others = [r for r in self._rows if r not in found.ranks]
        mine = [self._pace(r, window) for r in found.ranks]
        theirs = [self._pace(r, window) for r in others]
        if not others or None in mine or None in theirs or found.others_s <= 0:
            return None
        base = statistics.median(cast(list[float], theirs))
        slower = statistics.median(cast(list[float], mine)) / base - 1 if base > 0 else 0.0
        longer = found.own_s / found.others_s - 1
        return slower if longer > 0 and slower >= PACE_SHARE * longer else None

    def _slowed(self, found: Straggler, slower: float, steps: int, step: int) -> None:
        """Say once that a rank's own work was longer because its CPU ran slower (shared with
        other work): the hosts' condition, no rank named."""
        if self.busy is not None:
            return
        self.busy = BusyHosts((found.host,), 0.0, steps, step, ranks=found.ranks,
                              longer=found.own_s / found.others_s - 1, slower=slower)
        self.events.append(("busy", self.busy))

    def _busy(self, hosts: dict[int, str], step: int) -> None:
        """Say once that the ranks' hosts are busy with other work, when their waits for a CPU
        beyond one another cost :data:`COST_SHARE` of the latest steps' time and no rank (or
        host) accounts for it."""
        window = self._recent(step, WINDOWS[1])
        if len(window) < WINDOWS[0]:
            return
        waited = sum(d.cpu_s for d in window)
        wall = sum(d.wall_s for d in window)
        self.busy_now = wall > 0 and waited >= COST_SHARE * wall
        if self.busy is not None or not self.busy_now:
            return
        where = sorted({hosts.get(d.rank, "") for d in window if d.cpu_s > 0})
        self.busy = BusyHosts(tuple(where), waited / wall, len(window), step)
        self.events.append(("busy", self.busy))

    def _least(self) -> float:
        """The least delay that counts a step as one that lost time:
        :data:`MIN_EXCESS_UNREAD_S` when a rank's CPU time is not read."""
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
        """The verdict on the rank (or host) holding the others back now; else the hosts'
        condition when they were found busy (:class:`BusyHosts`); ``""`` when neither."""
        if self.current is not None:
            return self.current.text(unit)
        return self.busy.text(unit) if self.busy is not None and self.busy_now else ""

    def rank_rows(self, hosts: dict[int, str]) -> list[dict[str, Any]]:
        """Per rank: ``rank``, ``host``, ``steps`` and the mean ``step_s``, ``input_s``,
        ``compute_s``, ``comm_s``, ``cpu_wait_s``, ``cpu_s`` over the job."""
        return [{"rank": rank, "host": hosts.get(rank, ""), "steps": self.steps_of(rank),
                 **_columns(parts), "clock": self.clock.get(rank, "host"),
                 **({"gpu_peak_bytes": self.gpu[rank]["peak"]} if rank in self.gpu else {}),
                 **self._memory_columns(rank)}
                for rank, parts in self.per_rank().items()]

    def _memory_columns(self, rank: int) -> dict[str, int]:
        """``peak_bytes`` (host memory), and ``param_bytes`` and ``params_full_bytes`` of a
        sharded model, for the record's row of ``rank``."""
        memory = self.memory.get(rank) or {}
        columns = {"peak_bytes": memory["peak"]} if memory.get("peak") else {}
        if memory.get("params_full"):
            columns.update(param_bytes=memory["params"], params_full_bytes=memory["params_full"])
        return columns

    def clock_of(self, rank: int) -> str:
        """What ``rank``'s shares are prefixed with: :data:`GPU_TIME`, :data:`HOST_TIME` on a
        GPU rank timed by its host, else ``""``."""
        return clock_label(self.clock.get(rank, "host"), rank in self.gpu)

    def memory_text(self, rank: int) -> str:
        """``"GPU 3.1/80 GB (peak 4.0), 97% busy"`` on a GPU rank, ``"memory 1.2 GB (peak
        1.5)"`` on a CPU rank, with ``" · parameters 12 MB of 24 MB"`` (its shard of the
        whole) in sharded training; ``""`` before the rank reported any."""
        gb = 1024 ** 3
        gpu, memory = self.gpu.get(rank), self.memory.get(rank) or {}
        if gpu:
            busy = f", {gpu['util']}% busy" if gpu.get("util") is not None else ""
            text = (f"GPU {gpu['used'] / gb:.1f}/{gpu['total'] / gb:.0f} GB "
                    f"(peak {gpu['peak'] / gb:.1f}){busy}")
        elif memory.get("rss"):
            text = f"memory {memory['rss'] / gb:.1f} GB (peak {memory['peak'] / gb:.1f})"
        else:
            return ""
        if memory.get("params_full"):
            text += (f" · parameters {byte_size(memory['params'], binary=True)} of "
                     f"{byte_size(memory['params_full'], binary=True)}")
        return text

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
