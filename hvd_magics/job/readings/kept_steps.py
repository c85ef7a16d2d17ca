"""The steps the hosts keep in memory (``checkpoint.keep``), as the driver reads the ranks' ``kept``
events: which steps each host holds whole, where its keeper serves, and what keeping costs.

A host keeps the two newest steps of the job's replicated state. The step a later attempt
resumes from is the newest one every host that kept holds (:meth:`KeptSteps.resume_step`): the
hosts' ranks step together, so every host still holds it, the lost one's too, and a rank whose
host lacks it (a host new to the job) fetches it from a keeper that holds it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hvd_magics.common.sizes import byte_size
from hvd_magics.events import KeptEvent
from hvd_magics.protocol import KEPT


@dataclass
class HostKept:
    """One host's kept steps (newest last, at most the two newest) and its keeper."""

    steps: list[int] = field(default_factory=list)
    keeper: str = ""
    nbytes: int = 0


@dataclass
class KeptSteps:
    """What the hosts keep of one job, across its attempts (the controller keeps one, and each
    attempt shows it the events as a view of the job)."""

    hosts: dict[str, HostKept] = field(default_factory=dict)
    #: Seconds the copies took and the loops waited for them, and how many steps were kept.
    copy_s: float = 0.0
    stall_s: float = 0.0
    kept: int = 0

    def on_event(self, job: Any, event: dict[str, Any]) -> None:  # noqa: ARG002 - a view's
        if event.get("kind") == KEPT:
            self.observe(event)  # type: ignore[arg-type]

    def on_tick(self, job: Any) -> None:
        pass

    def on_end(self, job: Any) -> None:
        pass

    def observe(self, event: KeptEvent) -> None:
        """A rank's ``kept`` event."""
        if event.get("parts", 1) != 1:
            return  # a sharded part: not kept by this version
        host = self.hosts.setdefault(str(event.get("holder", "")), HostKept())
        step = int(event["step"])
        if step not in host.steps:
            host.steps = sorted([*host.steps, step])[-2:]
        host.keeper = str(event.get("keeper") or host.keeper)
        host.nbytes = int(event.get("nbytes", 0))
        self.copy_s += float(event.get("copy_s", 0.0))
        self.stall_s += float(event.get("stall_s", 0.0))
        self.kept += 1

    def resume_step(self) -> int | None:
        """The newest step every host that kept holds, or ``None``."""
        held = [set(host.steps) for host in self.hosts.values() if host.steps]
        if not held:
            return None
        common = set.intersection(*held)
        return max(common) if common else None

    def newest(self) -> int | None:
        """The newest step any host kept."""
        return max((h.steps[-1] for h in self.hosts.values() if h.steps), default=None)

    def peers(self, step: int) -> str:
        """The hosts holding ``step`` and their keepers (``host=address:port,...``)."""
        return ",".join(f"{name}={host.keeper}" for name, host in self.hosts.items()
                        if step in host.steps and host.keeper)

    def keepers(self) -> list[str]:
        return [host.keeper for host in self.hosts.values() if host.keeper]

    def memory_bytes(self) -> int:
        """What the hosts hold: two steps each."""
        return sum(2 * host.nbytes for host in self.hosts.values() if host.steps)

    def describe(self) -> str:
        """What the hosts held and what it cost, in words (``""``: nothing was kept)."""
        holding = [host for host in self.hosts.values() if host.steps]
        if not self.kept or not holding:
            return ""
        each = max(host.nbytes for host in holding)
        held = byte_size(self.memory_bytes(), binary=True)
        return (f"{self.kept:,} steps kept in memory, {byte_size(each, binary=True)} each; the "
                f"hosts hold {held} (2 steps on each of {len(holding)} "
                f"host{'s' if len(holding) != 1 else ''}); a copy took "
                f"{1000 * self.copy_s / self.kept:.0f} ms on average, and the loops waited "
                f"{self.stall_s:.2f} s for copies")

    def forget(self) -> None:
        """Resume from files from here on (the kept steps were found gone)."""
        self.hosts.clear()
