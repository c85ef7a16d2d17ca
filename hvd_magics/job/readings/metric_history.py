"""What a job's charts draw, gathered from the ranks' progress events (``progress``: the step's
metrics and samples/s; ``epoch_end``: the epoch's metrics, validation ones included) and from
their step splits (each rank's own work per step): :mod:`hvd_magics.job.views.charts` draws
them."""
from __future__ import annotations

import math

from hvd_magics.events import EpochEndEvent, ProgressEvent, Wire
from hvd_magics.protocol import EPOCH_END, PROGRESS, is_event

#: Most points kept per line (older ones are thinned out: every other one dropped).
MAX_POINTS = 400
#: Weight of the newest value in the smoothed step curve (an exponential moving average).
SMOOTHING = 0.3

#: Prefixes of validation metrics: Keras' and Lightning's habit, and Hugging Face's.
VALIDATION_PREFIXES = ("val_", "eval_")


def is_validation(name: str) -> bool:
    """Whether metric ``name`` is measured on validation data (drawn dashed, beside its twin)."""
    return name.startswith(VALIDATION_PREFIXES)


def _finite(metrics: dict[str, float] | None) -> dict[str, float]:
    """An event's metrics that are finite numbers (a rank may report anything)."""
    return {k: float(v) for k, v in (metrics or {}).items()
            if isinstance(v, (int, float)) and math.isfinite(v)}


def _thin(points: list[tuple[float, float]]) -> None:
    if len(points) > MAX_POINTS:
        del points[1:-1:2]


class MetricHistory:
    """What the charts draw, from the ranks' progress events.

    Attributes
    ----------
    steps : dict
        Metric name -> ``(step, smoothed value)`` of rank 0, steps counted across epochs.
    epochs : dict
        Metric name (``val_`` ones too) -> ``(epoch, value)`` of rank 0.
    rates : dict
        Rank -> ``(seconds since the job started, samples/s)``.
    own : dict
        Rank -> ``(seconds since the job started, ms of its own work per step)``: input and
        compute, what is left of a step without the wait in collectives
        (:mod:`hvd_magics.job.verdicts.straggler`).
    """

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.steps: dict[str, list[tuple[float, float]]] = {}
        self.epochs: dict[str, list[tuple[float, float]]] = {}
        self.rates: dict[int, list[tuple[float, float]]] = {}
        self.own: dict[int, list[tuple[float, float]]] = {}
        self._smoothed: dict[str, float] = {}
        #: When a chart last changed (``time.monotonic()``; 0: never).
        self.changed_at = 0.0

    def observe(self, rank: int, event: Wire, now: float) -> bool:
        """Take one ``progress`` or ``epoch_end`` event (any other draws nothing); whether a
        chart changed."""
        if not is_event(event):
            return False
        changed = False
        if event["kind"] == PROGRESS:
            changed = self._take_progress(rank, event, now)
        elif event["kind"] == EPOCH_END and rank == 0:
            changed = self._take_epoch(event)
        if changed:
            self.changed_at = now
        return changed

    def observe_own_work(self, rank: int, own_s: float, now: float) -> None:
        """Take a rank's mean own work per step (seconds) over its latest report."""
        if math.isfinite(own_s):
            self.own.setdefault(rank, []).append((now - self.started_at, 1000 * own_s))
            _thin(self.own[rank])
            self.changed_at = now

    def _take_epoch(self, event: EpochEndEvent) -> bool:
        metrics = _finite(event.get("metrics"))
        if not metrics:
            return False
        ended = float(event.get("epoch") or len(next(iter(self.epochs.values()), [])) + 1)
        for name, value in metrics.items():
            self.epochs.setdefault(name, []).append((ended, value))
        return True

    def _take_progress(self, rank: int, event: ProgressEvent, now: float) -> bool:
        changed = False
        rate = event.get("samples_per_s")
        if isinstance(rate, (int, float)) and math.isfinite(rate):
            self.rates.setdefault(rank, []).append((now - self.started_at, float(rate)))
            _thin(self.rates[rank])
            changed = True
        metrics = _finite(event.get("metrics"))
        if rank == 0 and metrics:
            epoch = int(event.get("epoch") or 1)
            steps = int(event.get("steps") or 0)
            step = (epoch - 1) * steps + int(event.get("step") or 0) if steps else \
                self._next_step()
            for name, value in metrics.items():
                if is_validation(name):
                    continue
                smooth = self._smoothed.get(name, value)
                smooth = SMOOTHING * value + (1 - SMOOTHING) * smooth
                self._smoothed[name] = smooth
                self.steps.setdefault(name, []).append((float(step), smooth))
                _thin(self.steps[name])
            changed = True
        return changed

    def _next_step(self) -> int:
        return len(next(iter(self.steps.values()), [])) + 1

    @property
    def empty(self) -> bool:
        return not (self.steps or self.epochs or self.rates or self.own)
