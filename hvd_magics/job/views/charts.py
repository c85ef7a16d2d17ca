"""Pictures of a job's progress: loss and metrics per step and per epoch, samples/s per rank.

:class:`MetricHistory` gathers what the ranks' progress events carry (``progress``: the step's
metrics and samples/s; ``epoch_end``: the epoch's metrics, validation ones included); its
:meth:`~MetricHistory.html` draws them as inline SVG, which a live widget shows (redrawn at most
once a second) and the run's record keeps, so the pictures stay in the saved notebook and in its
HTML export (nbconvert) without a widget state or a JavaScript library.
"""
from __future__ import annotations

import html
import math

from hvd_magics.events import EpochEndEvent, ProgressEvent, Wire
from hvd_magics.protocol import EPOCH_END, PROGRESS, is_event
from hvd_magics.rank_names import rank_named

#: Colours of the lines, in order (rank 0, 1, ... or metric 1, 2, ...).
PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037",
           "#9e9d24")
#: Most points kept per line (older ones are thinned out: every other one dropped).
MAX_POINTS = 400
#: Weight of the newest value in the smoothed step curve (an exponential moving average).
SMOOTHING = 0.3
#: Size of one chart, in pixels.
WIDTH, HEIGHT = 340, 170


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

    def html(self) -> str:
        """The charts side by side (``""`` when there is nothing to draw)."""
        charts = []
        for name, points in list(self.steps.items())[:2]:
            charts.append(svg_chart({name: points}, f"{name} per step (rank 0, smoothed)",
                                    "step"))
        if any(len(points) > 1 for points in self.epochs.values()):  # not one dot per line
            charts.append(svg_chart(_epoch_lines(self.epochs), "per epoch (rank 0)", "epoch",
                                    markers=True))
        if self.rates:
            charts.append(svg_chart({rank_named(r): p for r, p in sorted(self.rates.items())},
                                    "samples/s per rank", "seconds"))
        if len(self.own) > 1:
            charts.append(svg_chart({rank_named(r): p for r, p in sorted(self.own.items())},
                                    "own work per step, ms (input + compute)", "seconds"))
        if not charts:
            return ""
        return ("<div class='hvd-charts' style='display:flex;flex-wrap:wrap;gap:8px'>"
                + "".join(charts) + "</div>")


#: Prefixes of validation metrics: Keras' and Lightning's habit, and Hugging Face's.
VALIDATION_PREFIXES = ("val_", "eval_")


def is_validation(name: str) -> bool:
    """Whether metric ``name`` is measured on validation data (drawn dashed, beside its twin)."""
    return name.startswith(VALIDATION_PREFIXES)


def _epoch_lines(epochs: dict[str, list[tuple[float, float]]]) -> dict[str, list]:
    """Training metrics with their validation twin beside them, at most four lines."""
    names = [n for n in epochs if not is_validation(n)]
    ordered = []
    for name in names:
        ordered.append(name)
        ordered += [f"{prefix}{name}" for prefix in VALIDATION_PREFIXES
                    if f"{prefix}{name}" in epochs]
    ordered += [n for n in epochs if n not in ordered]
    return {name: epochs[name] for name in ordered[:4]}


def _ticks(low: float, high: float, whole: bool = False) -> list[float]:
    """A few round values between ``low`` and ``high`` (whole numbers only, with ``whole``)."""
    if high - low <= 1e-9 * max(abs(low), abs(high)):  # one value, as floats can tell
        return [low]
    step = 10 ** math.floor(math.log10((high - low) / 3))
    if whole:
        step = max(step, 1)
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= 5:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e5 else f"{value:.2e}"


def _labels(ticks: list[float]) -> list[str]:
    """The ticks' labels: three significant digits, or as many decimals as they need to differ
    (a loss between 2.3151 and 2.3156 was labelled 2.32 three times)."""
    labels = [_number(tick) for tick in ticks]
    if len(set(labels)) == len(labels) or len(ticks) < 2 or ticks[1] <= ticks[0]:
        return labels
    decimals = max(0, -math.floor(math.log10(ticks[1] - ticks[0]) + 1e-9))
    return [f"{tick:.{decimals}f}" for tick in ticks]


def svg_chart(series: dict[str, list[tuple[float, float]]], title: str, x_label: str,
              markers: bool = False) -> str:
    """One line chart as inline SVG: a line per series, axes with a few ticks, a legend."""
    points = [p for line in series.values() for p in line]
    if not points:
        return ""
    left, right, top, bottom = 48, 8, 22, 30
    plot_w, plot_h = WIDTH - left - right, HEIGHT - top - bottom
    x_low, x_high = min(p[0] for p in points), max(p[0] for p in points)
    y_low, y_high = min(p[1] for p in points), max(p[1] for p in points)
    if x_high == x_low:
        x_high = x_low + 1
    if y_high - y_low <= 1e-9 * max(abs(y_low), abs(y_high)):  # one value, as floats tell
        y_low, y_high = y_low - 0.5 * abs(y_low or 1), y_high + 0.5 * abs(y_high or 1)

    def sx(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y_low) / (y_high - y_low) * plot_h

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
             f"style='font:10px sans-serif;background:#fff'>",
             f"<text x='{left}' y='13' style='font-weight:bold'>{html.escape(title)}</text>",
             f"<rect x='{left}' y='{top}' width='{plot_w}' height='{plot_h}' fill='none' "
             "stroke='#999'/>"]
    y_ticks = _ticks(y_low, y_high)
    for tick, label in zip(y_ticks, _labels(y_ticks)):
        y = sy(tick)
        parts.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' "
                     f"stroke='#eee'/><text x='{left - 3}' y='{y + 3:.1f}' "
                     f"text-anchor='end'>{label}</text>")
    for tick in _ticks(x_low, x_high, whole=x_label in ("epoch", "step")):
        x = sx(tick)
        parts.append(f"<text x='{x:.1f}' y='{top + plot_h + 12}' text-anchor='middle'>"
                     f"{_number(tick)}</text>")
    parts.append(f"<text x='{left + plot_w / 2}' y='{HEIGHT - 3}' text-anchor='middle' "
                 f"fill='#666'>{html.escape(x_label)}</text>")
    for i, (name, line) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        dash = " stroke-dasharray='4 3'" if is_validation(name) else ""
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
        parts.append(f"<polyline points='{coords}' fill='none' stroke='{colour}' "
                     f"stroke-width='1.5'{dash}/>")
        if markers or len(line) == 1:
            parts.extend(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2.5' fill='{colour}'/>"
                         for x, y in line)
        parts.append(f"<text x='{left + plot_w - 4}' y='{top + 12 + 11 * i}' text-anchor='end' "
                     f"fill='{colour}'>{html.escape(name)}</text>")
    parts.append("</svg>")
    return "".join(parts)
