"""Each host's link, measured from the driver when every rank waits in communication.

A link slower than the others' slows every rank's collectives alike (a ring moves at its slowest
link's pace), so the step splits cannot say which host's it is (:mod:`hvd_magics.job.straggler`
names no rank then). When every rank of a job on several hosts spends most of its recent steps
in communication, the driver measures each host's link once: through one rank's event channel
per host, one host at a time, it sends :data:`PROBE_BYTES` down and asks for as many back
(``probe_link`` orders, answered by the task's channel itself), and times each round trip. A
host whose link (the slower of its two ways) is under :data:`SLOW_SHARE` of the others' is
named; otherwise the verdict says the links measured alike. The probe shares the links with the
training (it runs while the job does), so its figures are what was left for it, not the
links' capacity: they compare the hosts, which is what the verdict uses them for.
"""
from __future__ import annotations

import base64
import os
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from hvd_magics.protocol import PROBE_LINK

#: Bytes sent each way per host.
PROBE_BYTES = 4 * 1024 * 1024
#: How long one round trip may take before the host's probe is given up.
ANSWER_WAIT_S = 30.0
#: A host whose link moved less than this share of the other hosts' median is named.
SLOW_SHARE = 0.5
#: Every rank must have spent at least this share of its latest steps in communication.
COMM_BOUND_SHARE = 0.5


@dataclass(frozen=True)
class LinkSpeed:
    """What the probe moved to and from one host, in Mbit/s (``None``: no answer)."""

    host: str
    down_mbit: float | None
    up_mbit: float | None

    @property
    def slower(self) -> float:
        ways = [w for w in (self.down_mbit, self.up_mbit) if w is not None]
        return min(ways) if ways else 0.0


def verdict(speeds: list[LinkSpeed], comm_share: float, unit: str = "rank") -> str:
    """The links' verdict, as the dashboard and the record say it."""
    lead = (f"every {unit} waits in communication for most of its step (at least "
            f"{100 * comm_share:.0f}% of its latest steps)")
    measured = [s for s in speeds if s.slower > 0]
    if len(measured) < 2:
        return f"{lead}; the hosts' links could not be measured"
    slowest = min(measured, key=lambda s: s.slower)
    others = statistics.median(s.slower for s in measured if s is not slowest)
    if slowest.slower < SLOW_SHARE * others:
        return (f"{lead}; the link of host {slowest.host} is the slowest: "
                f"{_mbit(slowest.down_mbit)} to it and {_mbit(slowest.up_mbit)} from it, "
                f"against {others:,.0f} Mbit/s for the other hosts (measured from the driver "
                "while the job ran)")
    low, high = min(s.slower for s in measured), max(s.slower for s in measured)
    return (f"{lead}; the hosts' links measured alike from the driver ({low:,.0f} to "
            f"{high:,.0f} Mbit/s): no one host's link holds the others back")


def _mbit(value: float | None) -> str:
    return "no answer" if value is None else f"{value:,.0f} Mbit/s"


class LinkProbe:
    """Measure the links of ``hosts`` (host -> one of its ranks) through ``send(rank, order)``
    (the backend's :meth:`~hvd_magics.launch.backend.Backend.probe_link`), in a thread of its
    own; the answers come through :meth:`answer` (the job's events) and :attr:`speeds` fills
    in; ``done`` is set at the end."""

    def __init__(self, hosts: dict[str, int], send: Callable[[int, dict[str, Any]], bool]) -> None:
        self.hosts = dict(hosts)
        self._send = send
        self._answers: dict[str, float] = {}
        self._arrived = threading.Condition()
        self.speeds: list[LinkSpeed] = []
        self.done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="hvd-link-probe", daemon=True).start()

    def answer(self, event: dict[str, Any]) -> None:
        """A ``link_probe`` event arrived (from the job's events)."""
        with self._arrived:
            self._answers[str(event.get("request"))] = float(event.get("recv", time.monotonic()))
            self._arrived.notify_all()

    def _run(self) -> None:
        try:
            for host, rank in sorted(self.hosts.items()):
                down = self._round_trip(rank, PROBE_BYTES, 0)
                up = self._round_trip(rank, 0, PROBE_BYTES)
                self.speeds.append(LinkSpeed(host, _rate(down), _rate(up)))
        finally:
            self.done.set()

    def _round_trip(self, rank: int, down: int, up: int) -> float | None:
        request = uuid.uuid4().hex[:12]
        order = {"kind": PROBE_LINK, "request": request, "answer_bytes": up,
                 "data": base64.b64encode(os.urandom(down)).decode()}
        began = time.monotonic()
        if not self._send(rank, order):
            return None
        with self._arrived:
            if not self._arrived.wait_for(lambda: request in self._answers, ANSWER_WAIT_S):
                return None
            return self._answers.pop(request) - began


def _rate(seconds: float | None) -> float | None:
    """Mbit/s of :data:`PROBE_BYTES` (base64 on the wire) in ``seconds``."""
    if seconds is None or seconds <= 0:
        return None
    return PROBE_BYTES * 4 / 3 * 8 / 1e6 / seconds
