"""The notebook values a warm pool's ranks hold: each value a cell sends travels whole once, then
as its digest while every rank holds it unchanged (:mod:`hvd_magics.common.kept_values`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hvd_magics.common.kept_values import SentValue
from hvd_magics.launch.payload import sent_value


class HeldValues:
    """name -> digest of the notebook values every rank holds (after a cell that succeeded)."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}
        self._sending: dict[str, str] = {}

    def pack(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A cell's notebook values as they travel: each the ranks hold unchanged (same name,
        same pickle) as its digest only."""
        packed: dict[str, Any] = {}
        self._sending = {}
        for name, value in values.items():
            sent = sent_value(value)
            if sent is None:
                packed[name] = value
                continue
            self._sending[name] = sent.digest
            held = self._held.get(name) == sent.digest
            packed[name] = SentValue(sent.digest) if held else sent
        return packed

    def arrived(self, every_rank_ran_it: bool) -> None:
        """After a cell: what it sent is held when every rank ran it; else nothing is taken as
        held (a rank may have stopped before it kept a value): the next cell sends everything."""
        if every_rank_ran_it:
            self._held.update(self._sending)
        else:
            self._held.clear()
        self._sending = {}
