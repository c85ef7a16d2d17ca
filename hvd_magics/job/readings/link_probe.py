"""Each host's link, measured from the driver when every rank waits in communication
(:mod:`hvd_magics.job.verdicts.links` starts the probe and says the verdict).

A link slower than the others' slows every rank's collectives alike (a ring moves at its slowest
link's pace), so the step splits cannot say which host's it is
(:mod:`hvd_magics.job.verdicts.straggler` names no rank then). When every rank of a job on several
hosts spends most of its recent steps in communication, the driver measures each host's link once:
through one rank's event channel per host, one host at a time, it sends :data:`PROBE_BYTES` down and
asks for as many back (``probe_link`` orders, answered by the task's channel itself), and times each
round trip, :data:`ROUNDS` times (once, when it takes a second or more), keeping each way's best.
The probe shares the links with the training (it runs while the job does), so its figures are what
was left for it, not the links' capacity: they compare the hosts, which is what the verdict uses
them for.

A host whose CPUs are busy (other work, or a CPU quota) answers late on any link: its channel's
thread waits for a CPU to read the bytes and to send them back. Each answer says how long that
thread waited for a CPU (``schedstat``, :mod:`hvd_magics.thread_cpu`); a link's figure is the
round trip less that wait. A round trip more than half of which its host waited for a CPU says
too little of the link (what is left is mostly noise, and made such a host's link look up to
twenty times faster than the others', so that the verdict named another host's link): such a
way is left out of the comparison, and a host left with no way is compared with no one.
"""
from __future__ import annotations

import base64
import os
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
#: A round trip its host waited for a CPU for more than this share of says nothing of the link.
MAX_WAIT_SHARE = 0.5


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
        return best_mbit(self.down)

    @property
    def up_mbit(self) -> float | None:
        return best_mbit(self.up)

    @property
    def slower(self) -> float:
        """The link's slower way, in Mbit/s (0: no answer, or none that says of the link)."""
        return min((w for w in (self.down_mbit, self.up_mbit) if w is not None), default=0.0)

    @property
    def slower_timed(self) -> RoundTrip | None:
        """The slower way's best round trip as timed, the host's wait for a CPU included."""
        bests = [max(trips, key=lambda t: t.mbit) for trips in (self.down, self.up) if trips]
        return min(bests, key=lambda t: t.mbit, default=None)


def best_mbit(trips: tuple[RoundTrip, ...]) -> float | None:
    """The fastest of ``trips`` for the link (``None``: none says of the link)."""
    return max((m for t in trips if (m := t.link_mbit) is not None), default=None)


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
