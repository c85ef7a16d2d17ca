"""Report training progress from a rank to the notebook (PyTorch and custom loops).

Cheap enough to call every step: a call costs a clock read and a comparison; at most a few events
per second leave the rank. Outside a rank process every call is a no-op, so the same code runs on
a laptop.

Examples
--------
>>> from hvd_magics import progress
>>> for epoch in range(1, epochs + 1):                                # doctest: +SKIP
...     for step, (x, y) in enumerate(progress.track(loader, epoch=epoch, epochs=epochs,
...                                                  batch_size=64)):
...         loss = train_step(x, y)
...         progress.report(step + 1, loss=loss)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar
from collections.abc import Iterable, Iterator

from hvd_magics.events import EpochBeginEvent, EpochEndEvent, ProgressEvent
from hvd_magics.protocol import EPOCH_BEGIN, EPOCH_END, PROGRESS
from hvd_magics.rank import rank_events

#: Least seconds between two progress events from one rank.
MIN_INTERVAL_S = 0.25

T = TypeVar("T")


@dataclass
class _Epoch:
    epoch: int = 0
    epochs: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    started: float = 0.0
    last_emit: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    inferred: bool = False


_current = _Epoch()


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in metrics.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def start_epoch(epoch: int, epochs: int | None = None, steps: int | None = None,
                batch_size: int | None = None) -> None:
    """Say that epoch ``epoch`` (1-based) of ``epochs`` begins.

    ``steps`` (batches in the epoch) and ``batch_size`` (samples per batch) are optional; with the
    batch size the notebook shows samples per second.
    """
    begin_epoch(epoch, epochs, steps, batch_size)


def begin_epoch(epoch: int, epochs: int | None, steps: int | None, batch_size: int | None,
                inferred: bool = False) -> None:
    """:func:`start_epoch`, saying whether the epoch was inferred from what a loop does
    (:mod:`hvd_magics.rank.integrations.plain_loops`) rather than told."""
    _current.epoch, _current.epochs, _current.steps = epoch, epochs, steps
    _current.batch_size, _current.inferred = batch_size, inferred
    _current.metrics = {}
    _current.started = _current.last_emit = time.monotonic()
    rank_events.emit(EpochBeginEvent(kind=EPOCH_BEGIN, epoch=epoch, epochs=epochs, steps=steps))


def current_epoch() -> int:
    """The epoch under way (1-based; 0 before the first)."""
    return _current.epoch


def is_inferred() -> bool:
    """Whether the epoch under way was inferred (see :func:`begin_epoch`)."""
    return _current.inferred


def report(step: int, total: int | None = None, **metrics: Any) -> None:
    """Report step ``step`` (1-based) of the current epoch and the latest metrics (throttled; the
    latest metrics also go with the end of the epoch)."""
    if metrics:
        _current.metrics.update(metrics)  # as given: turned into floats once, at the epoch's end
    now = time.monotonic()
    if now - _current.last_emit < MIN_INTERVAL_S:
        return
    _current.last_emit = now
    elapsed = now - _current.started
    rate = step * _current.batch_size / elapsed if _current.batch_size and elapsed > 0 else None
    rank_events.emit(ProgressEvent(kind=PROGRESS, epoch=_current.epoch, step=step,
                                   steps=total if total is not None else _current.steps,
                                   samples_per_s=rate, metrics=_floats(metrics)))


def samples_per_step(count: int | None) -> None:
    """Say how many samples one step of the epoch under way takes, for samples per second (a
    loop that accumulates gradients learns it at its first optimizer step)."""
    _current.batch_size = count


def record(**metrics: Any) -> None:
    """Keep the latest values of ``metrics`` for the next report and the epoch's end, sending
    nothing now (what a loop logs between its steps)."""
    _current.metrics.update(metrics)


def end_epoch(samples: int | None = None, **metrics: Any) -> None:
    """Say that the current epoch ended, having seen ``samples`` samples on this rank; its
    metrics are ``metrics`` over the latest ones :func:`report` was given."""
    duration = time.monotonic() - _current.started
    rank_events.emit(EpochEndEvent(kind=EPOCH_END, epoch=_current.epoch, epochs=_current.epochs,
                                   duration=duration, samples=samples,
                                   metrics=_floats({**_current.metrics, **metrics})))


def track(iterable: Iterable[T], epoch: int, epochs: int | None = None, total: int | None = None,
          batch_size: int | None = None) -> Iterator[T]:
    """Yield from ``iterable`` as one epoch: begin, a progress report per item, end.

    Parameters
    ----------
    iterable : iterable
        The batches of one epoch.
    epoch, epochs : int
        This epoch (1-based) and how many there are.
    total : int, optional
        Number of batches (``len(iterable)`` when it has one).
    batch_size : int, optional
        Samples per batch, for samples per second.
    """
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    start_epoch(epoch, epochs, total, batch_size)
    count = 0
    for count, item in enumerate(iterable, 1):
        yield item
        report(count, total)
    end_epoch(samples=count * batch_size if batch_size else None)
