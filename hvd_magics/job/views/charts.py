"""Pictures of a job's progress: loss and metrics per step and per epoch, samples/s per rank.

:class:`~hvd_magics.job.readings.metric_history.MetricHistory` gathers what the ranks'
progress events carry; :func:`charts_html` draws it as inline SVG, which a live widget shows
(redrawn at most once a second) and the run's record keeps, so the pictures stay in the saved
notebook and in its HTML export (nbconvert) without a widget state or a JavaScript library.
"""
from __future__ import annotations

import html
import math

from hvd_magics.job.readings.metric_history import VALIDATION_PREFIXES, MetricHistory, is_validation
from hvd_magics.rank_names import rank_named

#: Colours of the lines, in order (rank 0, 1, ... or metric 1, 2, ...).
PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037",
           "#9e9d24")
#: Size of one chart, in pixels.
WIDTH, HEIGHT = 340, 170


def charts_html(history: MetricHistory) -> str:
    """``history``'s charts side by side, as inline SVG (``""`` when there is nothing to draw)."""
    charts = []
    for name, points in list(history.steps.items())[:2]:
        charts.append(svg_chart({name: points}, f"{name} per step (rank 0, smoothed)",
                                "step"))
    if any(len(points) > 1 for points in history.epochs.values()):  # not one dot per line
        charts.append(svg_chart(_epoch_lines(history.epochs), "per epoch (rank 0)", "epoch",
                                markers=True))
    if history.rates:
        charts.append(svg_chart({rank_named(r): p for r, p in sorted(history.rates.items())},
                                "samples/s per rank", "seconds"))
    if len(history.own) > 1:
        charts.append(svg_chart({rank_named(r): p for r, p in sorted(history.own.items())},
                                "own work per step, ms (input + compute)", "seconds"))
    if not charts:
        return ""
    return ("<div class='hvd-charts' style='display:flex;flex-wrap:wrap;gap:8px'>"
            + "".join(charts) + "</div>")


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
