"""Epoch timing, computed on the driver from progress events and ``Epoch y/z`` output lines.

Clocks: a rank's epoch duration is measured on that rank's own clock (``epoch_end.duration``).
Spans across ranks (an epoch's wall time, the benchmark study's line-to-line measure, start-up)
use the driver's clock at receipt (``recv``), one clock for all ranks. Timestamps taken on
different hosts are never subtracted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hvd_magics.events import Wire
from hvd_magics.protocol import EPOCH_BEGIN, EPOCH_END, OUTPUT, is_event

#: A Keras-style epoch header in a rank's output (the study's ``[1,x]:Epoch y/z``).
EPOCH_LINE = re.compile(r"^\s*Epoch (\d+)/(\d+)\b")


@dataclass
class _Epoch:
    epoch: int
    first_begin: float | None = None
    last_end: float | None = None
    first_line: float | None = None
    rank_durations: dict[int, float] = field(default_factory=dict)
    samples: int = 0
    samples_known: bool = True


class EpochTimer:
    """Collect per-epoch timing for one job."""

    def __init__(self, submitted: float) -> None:
        self.submitted = submitted
        self._epochs: dict[int, _Epoch] = {}
        self.first_training: float | None = None
        self.last_training: float | None = None

    def _get(self, epoch: int) -> _Epoch:
        return self._epochs.setdefault(epoch, _Epoch(epoch))

    def observe(self, event: Wire) -> None:
        """Take what matters for timing from one event."""
        if not is_event(event):
            return
        recv = event.get("recv", 0.0)
        if event["kind"] == EPOCH_BEGIN:
            row = self._get(int(event["epoch"]))
            row.first_begin = recv if row.first_begin is None else min(row.first_begin, recv)
            self._training(recv)
        elif event["kind"] == EPOCH_END:
            row = self._get(int(event["epoch"]))
            row.last_end = recv if row.last_end is None else max(row.last_end, recv)
            rank = event.get("rank")
            if rank is not None:  # the channel stamps every rank's event with it
                row.rank_durations[rank] = float(event.get("duration") or 0.0)
            samples = event.get("samples")
            if samples is None:
                row.samples_known = False
            else:
                row.samples += int(samples)
            self._training(recv)
        elif event["kind"] == OUTPUT:
            for line in event.get("lines", []):
                match = EPOCH_LINE.match(line)
                if match:
                    row = self._get(int(match.group(1)))
                    if row.first_line is None:
                        row.first_line = recv
                    self._training(recv)

    def _training(self, recv: float) -> None:
        if self.first_training is None:
            self.first_training = recv
        self.last_training = recv

    def rows(self) -> list[dict[str, Any]]:
        """One row per epoch: durations per rank, wall time across ranks, the study's measure."""
        rows = []
        for number in sorted(self._epochs):
            row = self._epochs[number]
            nxt = self._epochs.get(number + 1)
            wall = (row.last_end - row.first_begin
                    if row.first_begin is not None and row.last_end is not None else None)
            study = (nxt.first_line - row.first_line
                     if nxt is not None and nxt.first_line is not None
                     and row.first_line is not None else None)
            samples = row.samples if row.samples_known and row.rank_durations else None
            rows.append({
                "epoch": number,
                "rank_seconds": dict(sorted(row.rank_durations.items())),
                "slowest_rank_s": max(row.rank_durations.values(), default=None),
                "wall_s": wall,
                "line_to_line_s": study,
                "samples": samples,
                "samples_per_s": samples / wall if samples and wall else None,
            })
        return rows

    def split(self, ended: float) -> dict[str, float | None]:
        """The run's wall time split into start-up (to the first epoch) and training."""
        if self.first_training is None:
            return {"startup_s": None, "training_s": None}
        return {"startup_s": self.first_training - self.submitted,
                "training_s": (self.last_training or ended) - self.first_training}


#: The epoch table's columns: heading, row key, and decimals (``None``: a whole number).
TABLE_COLUMNS = (("epoch", "epoch", None), ("wall s", "wall_s", 3),
                 ("slowest rank s", "slowest_rank_s", 3), ("line-to-line s", "line_to_line_s", 3),
                 ("samples/s", "samples_per_s", 0))


def _cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[str(row[key]) if digits is None else fmt_number(row[key], digits)
             for _, key, digits in TABLE_COLUMNS] for row in rows]


def format_table(rows: list[dict[str, Any]]) -> str:
    """The epoch rows as a fixed-width text table."""
    if not rows:
        return ""
    cells = _cells(rows)
    widths = [max(len(heading), *(len(c[i]) for c in cells))
              for i, (heading, _, _) in enumerate(TABLE_COLUMNS)]
    lines = [[heading for heading, _, _ in TABLE_COLUMNS], *cells]
    return "\n".join(" ".join(f"{cell:>{w}}" for cell, w in zip(line, widths)) for line in lines)


def format_html_table(rows: list[dict[str, Any]]) -> str:
    """The epoch rows as an HTML table (class ``hvd-epochs``)."""
    if not rows:
        return ""
    head = "".join(f"<th>{heading}</th>" for heading, _, _ in TABLE_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
                   for cells in _cells(rows))
    return f"<table class='hvd-epochs'><tr>{head}</tr>{body}</table>"


def fmt_number(value: float | None, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, or ``-`` when unknown."""
    return "-" if value is None else f"{value:.{digits}f}"
