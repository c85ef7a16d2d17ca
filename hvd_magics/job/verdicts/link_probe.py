"""Each host's link, measured from the driver when every rank waits in communication.

A link slower than the others' slows every rank's collectives alike (a ring moves at its slowest
link's pace), so the step splits cannot say which host's it is
(:mod:`hvd_magics.job.verdicts.straggler` names no rank then). When every rank of a job on several
hosts spends most of its recent steps in communication, the driver measures each host's link once:
through one rank's event channel per host, one host at a time, it sends :data:`PROBE_BYTES` down and
asks for as many back (``probe_link`` orders, answered by the task's channel itself), and times each
round trip, :data:`ROUNDS` times (once, when it takes a second or more), keeping each way's best. A
host whose link (the slower of its two ways) is under :data:`SLOW_SHARE` of the others' is named;
otherwise the verdict says the links measured alike. The probe shares the links with the training
(it runs while the job does), so its figures are what was left for it, not the links' capacity: they
compare the hosts, which is what the verdict uses them for.

A host whose CPUs are busy (other work, or a CPU quota) answers late on any link: its channel's
thread waits for a CPU to read the bytes and to send them back. Each answer says how long that
thread waited for a CPU (``schedstat``, :mod:`hvd_magics.thread_cpu`); a link's figure is the
round trip less that wait. A round trip more than half of which its host waited for a CPU says
too little of the link (what is left is mostly noise, and made such a host's link look up to
twenty times faster than the others', so that the verdict named another host's link): such a
way is left out of the comparison, and a host left with no way is compared with no one. A host
that answered slowest because of that wait is not named for its link: the verdict says its CPUs
are busy.
"""
from __future__ import annotations

import base64
import os
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from hvd_magics.protocol import PROBE_LINK

#: Bytes sent each way per host.
PROBE_BYTES = 4 * 1024 * 1024
#: Round trips each way per host; the fastest counts (a moment's stall is not the link)...
ROUNDS = 3
#: ...but a host whose round trip took this long is not asked again: a stall is small beside
#: it, and a slow link's three rounds outlasted short jobs.
ONCE_OVER_S = 1.0
#: How long one round trip may take before the host's probe is given up.
ANSWER_WAIT_S = 30.0
#: How long, after an answer, its host's word on its wait for a CPU may take to follow.
CPU_WAIT_WORD_S = 5.0
#: A host whose link moved less than this share of the other hosts' median is named. Not half:
#: on equal links, a host under a CPU quota came out at 616 Mbit/s against 1,268 with its wait
#: for a CPU taken out (its channel also waits for Python's lock, held by its other threads,
#: which no CPU-wait figure shows); a link slower than the probe's own pace (about a Gbit/s on
#: a small host) is several times slower (a 50 Mbit/s link: 13 to 29 against 1,000).
SLOW_SHARE = 0.25
#: A host that answered in less than this share of the others' pace, mostly waiting for a CPU,
#: is said to be busy.
LATE_SHARE = 0.5
#: A round trip its host waited for a CPU for more than this share of says nothing of the link.
MAX_WAIT_SHARE = 0.5
#: Every rank must have spent at least this share of its latest steps in communication.
COMM_BOUND_SHARE = 0.5


@dataclass(frozen=True)
class RoundTrip:
    """One round trip to a host: its seconds, and how long the host's channel waited for a CPU
    in it."""

    seconds: float
    cpu_wait_s: float = 0.0

    def __post_init__(self) -> None:
        # the host's thread may have waited before the order's first byte or after its
        # answer's last (a wait of 246 ms was said of a 216 ms round trip): not in the trip
        object.__setattr__(self, "cpu_wait_s", min(max(self.cpu_wait_s, 0.0), self.seconds))

    @property
    def mbit(self) -> float:
        """Mbit/s as timed."""
        return _rate(self.seconds)

    @property
    def waited_mostly(self) -> bool:
        """Whether the host waited for a CPU for most of it (:data:`MAX_WAIT_SHARE`)."""
        return self.cpu_wait_s > MAX_WAIT_SHARE * self.seconds

    @property
    def link_mbit(self) -> float | None:
        """Mbit/s of the link: the round trip less the host's wait for a CPU (``None`` when
        that wait was most of it: what is left says nothing of the link)."""
        if self.waited_mostly:
            return None
        return _rate(self.seconds - self.cpu_wait_s)


@dataclass(frozen=True)
class LinkSpeed:
    """The round trips to and from one host, :data:`ROUNDS` each way at most (none: no
    answer); each way's best counts."""

    host: str
    down: tuple[RoundTrip, ...] = ()
    up: tuple[RoundTrip, ...] = ()

    @property
    def down_mbit(self) -> float | None:
        return _best(self.down)

    @property
    def up_mbit(self) -> float | None:
        return _best(self.up)

    @property
    def slower(self) -> float:
        """The link's slower way, in Mbit/s (0: no answer, or none that says of the link)."""
        return min((w for w in (self.down_mbit, self.up_mbit) if w is not None), default=0.0)

    @property
    def slower_timed(self) -> RoundTrip | None:
        """The slower way's best round trip as timed, the host's wait for a CPU included."""
        bests = [max(trips, key=lambda t: t.mbit) for trips in (self.down, self.up) if trips]
        return min(bests, key=lambda t: t.mbit, default=None)


def _best(trips: tuple[RoundTrip, ...]) -> float | None:
    """The fastest of ``trips`` for the link (``None``: none says of the link)."""
    return max((m for t in trips if (m := t.link_mbit) is not None), default=None)


def verdict(speeds: list[LinkSpeed], comm_share: float, unit: str = "rank") -> str:
    """The links' verdict, as the dashboard and the record say it."""
    lead = (f"every {unit} waits in communication for most of its step (at least "
            f"{100 * comm_share:.0f}% of its latest steps)")
    measured = [s for s in speeds if s.slower > 0]
    if len(measured) < 2:
        answered = [s for s in speeds if s.slower_timed is not None]
        busy = _busy_host(answered)
        if busy is not None:
            return f"{lead}; the hosts' links could not be compared: {busy}"
        waited = [s.host for s in answered if s.slower == 0]  # every way mostly a wait
        if waited and len(answered) >= 2:
            who = f"host {waited[0]}" if len(waited) == 1 else f"hosts {', '.join(waited)}"
            return (f"{lead}; the hosts' links could not be compared: {who} waited for a CPU "
                    "for most of every round trip (its CPUs are busy: other work, or a CPU "
                    "quota)")
        return f"{lead}; the hosts' links could not be measured"
    slowest = min(measured, key=lambda s: s.slower)
    others = statistics.median(s.slower for s in measured if s is not slowest)
    if slowest.slower < SLOW_SHARE * others:
        return (f"{lead}; the link of host {slowest.host} is the slowest: "
                f"{_way(slowest.down)} to it and {_way(slowest.up)} from it, "
                f"against {others:,.0f} Mbit/s for the other hosts (measured from the driver "
                "while the job ran)")
    low, high = min(s.slower for s in measured), max(s.slower for s in measured)
    busy = _busy_host(measured)
    if busy is not None:
        return (f"{lead}; no one host's link holds the others back ({low:,.0f} to "
                f"{high:,.0f} Mbit/s, measured from the driver), but {busy}")
    return (f"{lead}; the hosts' links measured alike from the driver ({low:,.0f} to "
            f"{high:,.0f} Mbit/s): no one host's link holds the others back")


def _busy_host(measured: list[LinkSpeed]) -> str | None:
    """What to say of a host that answered under :data:`LATE_SHARE` of the others' pace, mostly
    waiting for a CPU (``None``: none did)."""
    if len(measured) < 2:
        return None
    # every host here answered (a way measured, or timed only): each has its slower way timed
    timed = {s.host: trip for s in measured if (trip := s.slower_timed) is not None}
    slowest = min(measured, key=lambda s: timed[s.host].mbit)
    trip = timed[slowest.host]
    others = statistics.median(timed[s.host].mbit for s in measured if s is not slowest)
    if trip.mbit >= LATE_SHARE * others or not trip.waited_mostly:
        return None
    waited = ("all" if trip.cpu_wait_s >= trip.seconds else
              f"{1000 * trip.cpu_wait_s:,.0f} ms")
    return (f"host {slowest.host} answered slowest ({trip.mbit:,.0f} Mbit/s against "
            f"{others:,.0f} for the other hosts) because it waited for a CPU for {waited} of "
            f"its {1000 * trip.seconds:,.0f} ms: its CPUs are busy (other work, or a CPU "
            "quota), which slows its ranks' communication too")


def _way(trips: tuple[RoundTrip, ...]) -> str:
    """One way of a host's link as the verdict says it."""
    best = _best(trips)
    if best is not None:
        return f"{best:,.0f} Mbit/s"
    return "not known (its host waited for a CPU)" if trips else "no answer"


class LinkProbe:
    """Measure the links of ``hosts`` (host -> one of its ranks) through ``send(rank, order)``
    (the backend's :meth:`~hvd_magics.launch.backend.Backend.probe_link`), in a thread of its
    own; the answers come through :meth:`answer` (the job's events) and :attr:`speeds` fills
    in; ``done`` is set at the end."""

    def __init__(self, hosts: dict[str, int], send: Callable[[int, dict[str, Any]], bool]) -> None:
        self.hosts = dict(hosts)
        self._send = send
        self._answers: dict[str, float] = {}
        self._cpu_waits: dict[str, float] = {}
        self._arrived = threading.Condition()
        self.speeds: list[LinkSpeed] = []
        self.done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="hvd-link-probe", daemon=True).start()

    def answer(self, event: dict[str, Any]) -> None:
        """A ``link_probe`` event arrived (from the job's events): the answer's bytes, or then
        its host's wait for a CPU."""
        request = str(event.get("request"))
        with self._arrived:
            if "cpu_wait_s" in event:
                self._cpu_waits[request] = float(event["cpu_wait_s"] or 0.0)
            else:
                self._answers[request] = float(event.get("recv", time.monotonic()))
            self._arrived.notify_all()

    def _run(self) -> None:
        trips: dict[str, tuple[list[RoundTrip], list[RoundTrip]]] = {
            host: ([], []) for host in self.hosts}
        ended: set[str] = set()  # silent, or slow enough to be asked once
        try:
            for _round in range(ROUNDS):
                for host, rank in sorted(self.hosts.items()):
                    if host in ended:
                        continue
                    for way, (down, up) in enumerate(((PROBE_BYTES, 0), (0, PROBE_BYTES))):
                        trip = self._round_trip(rank, down, up)
                        if trip is None:
                            ended.add(host)
                            break
                        trips[host][way].append(trip)
                        if trip.seconds >= ONCE_OVER_S:
                            ended.add(host)
            self.speeds = [LinkSpeed(host, tuple(down), tuple(up))
                           for host, (down, up) in sorted(trips.items())]
        finally:
            self.done.set()

    def _round_trip(self, rank: int, down: int, up: int) -> RoundTrip | None:
        request = uuid.uuid4().hex[:12]
        order = {"kind": PROBE_LINK, "request": request, "answer_bytes": up,
                 "data": base64.b64encode(os.urandom(down)).decode()}
        began = time.monotonic()
        if not self._send(rank, order):
            return None
        with self._arrived:
            if not self._arrived.wait_for(lambda: request in self._answers, ANSWER_WAIT_S):
                return None
            seconds = self._answers.pop(request) - began
            self._arrived.wait_for(lambda: request in self._cpu_waits, CPU_WAIT_WORD_S)
            return RoundTrip(seconds, self._cpu_waits.pop(request, 0.0)) if seconds > 0 else None


def _rate(seconds: float) -> float:
    """Mbit/s of :data:`PROBE_BYTES` (base64 on the wire) in ``seconds``."""
    return PROBE_BYTES * 4 / 3 * 8 / 1e6 / seconds
