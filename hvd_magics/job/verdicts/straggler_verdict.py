"""A straggler verdict: the rank (or every rank of one host) whose own work holds the others
back, its figures and its cause in words (:class:`Straggler`), drawn from one window's mean steps
(:func:`verdict`, :func:`look`); :mod:`hvd_magics.job.verdicts.straggler` says when a rank is
named and cleared."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from hvd_magics.job.readings.step_parts import StepParts
from hvd_magics.rank_names import ranks_named

#: A verdict that the rank was longer "in N of its last M steps" is given when that is under
#: this share of them.
STEADY_SHARE = 0.5
#: How much longer (a share of the others' own work) a rank's own work must be than theirs to be
#: named, and below which it is cleared.
NAME_SHARE = 0.08
#: The least excess of a rank's own work that counts, in seconds a step: a smaller difference
#: is within what timing a step's parts costs and how much a step of a fraction of a
#: millisecond varies.
MIN_EXCESS_S = 0.0002
#: Of that excess, the least share the others must spend waiting in communication.
WAIT_SHARE = 0.5
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


def _ms(seconds: float) -> str:
    """``"105 ms"``, ``"15 ms"``, ``"6.7 ms"``, ``"0.35 ms"``."""
    ms = 1000 * seconds
    return f"{ms:.0f} ms" if abs(ms) >= 10 else f"{ms:.2g} ms"


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
