"""An elastic job's formations of its ranks, as the driver sent them (``resize`` events): the
first is its start, each later one a reset."""
from __future__ import annotations

from typing import Any


class Formations(list[dict[str, Any]]):
    """Each formation's ``reset``, ``size``, ``ranks`` (task -> rank), ``causes`` and
    ``time``, in order."""

    def add(self, event: dict[str, Any]) -> dict[int, int]:
        """Keep a ``resize`` event's formation; its ranks as task -> rank."""
        self.append({k: event.get(k) for k in ("reset", "size", "ranks", "causes", "time")})
        return {int(task): rank for task, rank in (event.get("ranks") or {}).items()}

    @property
    def resets(self) -> list[dict[str, Any]]:
        """The re-formings (the formations after the first)."""
        return self[1:]

    def size(self, fixed: int) -> int:
        """How many ranks there are now: the latest formation's, else ``fixed``."""
        return self[-1]["size"] if self else fixed
