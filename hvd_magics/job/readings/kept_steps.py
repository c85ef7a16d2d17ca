"""The steps the hosts keep in memory (``checkpoint.keep``), as the driver reads the ranks' ``kept``
events: which parts of which steps each host holds, where its keeper serves, and what keeping
costs.

A replicated state is one part, kept whole by every host: the step a later attempt resumes from
is the newest one every host that kept holds (the hosts' ranks step together, so every host
still holds it, a lost one's too, and a rank whose host lacks it fetches it from a keeper that
holds it). A sharded state is a part per rank, each kept by its rank's host and sent to the
next host's keeper: the step is the newest one whose every part some host not lost holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hvd_magics.common.sizes import byte_size
from hvd_magics.events import KeptEvent
from hvd_magics.protocol import KEPT

#: Steps of each part a host holds: the newest two (hvd_magics.common.kept_steps).
_STEPS_HELD = 2


@dataclass
class HostKept:
    """One host's kept parts (step -> the parts of it the host holds, the newest steps) and
    its keeper."""

    held: dict[int, set[int]] = field(default_factory=dict)
    keeper: str = ""
    nbytes: int = 0

    @property
    def steps(self) -> list[int]:
        """The steps of which the host holds any part, oldest first."""
        return sorted(self.held)


@dataclass
class KeptSteps:
    """What the hosts keep of one job, across its attempts (the controller keeps one, and each
    attempt shows it the events as a view of the job)."""

    hosts: dict[str, HostKept] = field(default_factory=dict)
    #: How many parts each step has (1: a replicated state).
    parts: int = 1
    #: Seconds the copies took and the loops waited for them, and how many steps were kept.
    copy_s: float = 0.0
    stall_s: float = 0.0
    kept: int = 0
    copies: int = 0
    #: Per part, the newest step its own host kept and the newest its peer holds.
    own_newest: dict[int, int] = field(default_factory=dict)
    peer_newest: dict[int, int] = field(default_factory=dict)

    def on_event(self, job: Any, event: dict[str, Any]) -> None:  # noqa: ARG002 - a view's
        if event.get("kind") == KEPT:
            self.observe(event)  # type: ignore[arg-type]

    def on_tick(self, job: Any) -> None:
        pass

    def on_end(self, job: Any) -> None:
        pass

    def observe(self, event: KeptEvent) -> None:
        """A rank's ``kept`` event."""
        host = self.hosts.setdefault(str(event.get("holder", "")), HostKept())
        step, part = int(event["step"]), int(event.get("part", 0))
        self.parts = int(event.get("parts", 1))
        if part in host.held.get(step, ()):  # said again, with its host's keeper
            host.keeper = str(event.get("keeper") or host.keeper)
            return
        host.held.setdefault(step, set()).add(part)
        for old in sorted(s for s, held in host.held.items() if part in held)[:-_STEPS_HELD]:
            host.held[old].discard(part)  # the host's keeper removed it
            if not host.held[old]:
                del host.held[old]
        host.keeper = str(event.get("keeper") or host.keeper)
        newest = self.peer_newest if event.get("peer") else self.own_newest
        newest[part] = max(step, newest.get(part, step))
        if event.get("peer"):
            return
        host.nbytes = int(event.get("nbytes", 0))
        self.copy_s += float(event.get("copy_s", 0.0))
        self.stall_s += float(event.get("stall_s", 0.0))
        self.copies += 1
        self.kept += 1 if part == 0 else 0

    def resume_step(self) -> int | None:
        """The newest step the hosts hold whole (``None``: none)."""
        holding = [host for host in self.hosts.values() if host.held]
        if not holding:
            return None
        if self.parts == 1:
            common = set.intersection(*(set(host.held) for host in holding))
            return max(common) if common else None
        whole = [step for step in {s for host in holding for s in host.held}
                 if set().union(*(host.held.get(step, set()) for host in holding))
                 >= set(range(self.parts))]
        return max(whole) if whole else None

    def newest(self) -> int | None:
        """The newest step any host kept a part of."""
        return max((max(h.held) for h in self.hosts.values() if h.held), default=None)

    def peers(self, step: int) -> str:
        """The hosts holding a part of ``step`` and their keepers (``host=address:port,...``)."""
        return ",".join(f"{name}={host.keeper}" for name, host in self.hosts.items()
                        if step in host.held and host.keeper)

    def keepers(self) -> list[str]:
        return [host.keeper for host in self.hosts.values() if host.keeper]

    def lost(self, host: str) -> None:
        """``host`` stopped answering: what it holds cannot be fetched."""
        self.hosts.pop(host, None)

    def memory_bytes(self) -> int:
        """What the hosts hold: two steps of each part each holds (its own, a peer's)."""
        return sum(_STEPS_HELD * host.nbytes * len(host.held[max(host.held)])
                   for host in self.hosts.values() if host.held)

    def peer_lag(self) -> int | None:
        """How many steps the peers' copies were behind at most (``None``: not sharded)."""
        if self.parts == 1 or not self.own_newest:
            return None
        return max(newest - self.peer_newest.get(part, -1)
                   for part, newest in self.own_newest.items())

    def describe(self) -> str:
        """What the hosts held and what it cost, in words (``""``: nothing was kept)."""
        holding = [host for host in self.hosts.values() if host.held]
        if not self.kept or not holding:
            return ""
        each = max(host.nbytes for host in holding)
        held = byte_size(self.memory_bytes(), binary=True)
        what = (f"{byte_size(each, binary=True)} each" if self.parts == 1 else
                f"{self.parts} parts of {byte_size(each, binary=True)} each")
        lag = self.peer_lag()
        peers = ("" if lag is None else "; the next host's copy of each part was "
                 + ("up to date" if lag <= 0 else f"{lag} step{'s' if lag != 1 else ''} behind")
                 + " at the end")
        if self.parts > 1 and len(self.own_newest) < self.parts:
            peers += (f"; only {len(self.own_newest)} of the {self.parts} ranks kept their parts "
                      "(keep is called on every rank of a sharded state), so restarts resume "
                      "from files")
        hosts = f"{len(holding)} host{'s' if len(holding) != 1 else ''}"
        where = (f"2 steps on each of {hosts}" if self.parts == 1 else
                 f"2 steps of each part, on {hosts}")
        return (f"{self.kept:,} steps kept in memory, {what}; the hosts hold {held} ({where})"
                f"{peers}; a copy took {1000 * self.copy_s / max(1, self.copies):.0f} ms on "
                f"average, and the loops waited {self.stall_s:.2f} s for copies")

    def forget(self) -> None:
        """Resume from files from here on (the kept steps were found gone)."""
        self.hosts.clear()
