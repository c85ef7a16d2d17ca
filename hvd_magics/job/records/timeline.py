"""Horovod Timeline: where a run's trace goes, making a broken trace readable, and summarising it.

Horovod's coordinator (rank 0) writes a Chrome-trace JSON array, one object after another on long
lines, rewriting the closing ``]`` after each event. A run that was killed leaves a file cut
anywhere (or holding only ``[``). :func:`repair` cuts after the last complete object and closes the
array; :func:`iter_events` decodes objects from fixed-size chunks, so a trace of hundreds of MB is
summarised in constant memory. An elastic job's rank 0 starts its trace again after a reset,
appending a second array (``...][...``) whose times and tensor ids start from zero again;
:func:`repair` joins them into one array on one clock, with distinct ids.
"""
from __future__ import annotations

import codecs
import html
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from collections.abc import Iterator

#: Bytes read at a time while scanning a trace.
CHUNK_BYTES = 1 << 20
#: The cost of recording, said once per session when the timeline is turned on.
COST_WARNING = ("Horovod Timeline is on for the next %%horovod runs. It slows training "
                "(Databricks measured about 40% lower Inception3 throughput); turn it off with "
                "%hvd_timeline off when you are done.")
#: How many tensors the picture and the slowest-tensor table show.
TOP_TENSORS = 8
#: Most spans kept for the picture (the tables count every event).
MAX_SPANS = 20_000

_DECODER = json.JSONDecoder()


def default_path(folder: str | os.PathLike = "hvd_timelines", job_id: str = "") -> Path:
    """A fresh timestamped file name in ``folder``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(folder) / f"timeline-{stamp}{'-' + job_id if job_id else ''}.json"


def iter_events(path: str | os.PathLike) -> Iterator[tuple[dict, int]]:
    """Yield ``(event, end_offset)`` for each complete object of a trace, reading in chunks.

    ``end_offset`` is the byte offset just past the object. A partial last object is not yielded.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open(path, "rb") as fh:
        buffer, offset, eof = "", 0, False  # offset: bytes of the file before buffer[pos]
        while True:
            pos = 0
            while True:
                start = pos
                while pos < len(buffer) and buffer[pos] in "[], \n\r\t":
                    pos += 1
                offset += pos - start  # separators are ASCII: one byte each
                if pos >= len(buffer):
                    break
                try:
                    event, end = _DECODER.raw_decode(buffer, pos)
                except json.JSONDecodeError:
                    break  # an incomplete object: read more, or stop at the end of the file
                offset += len(buffer[pos:end].encode())
                pos = end
                if isinstance(event, dict):
                    yield event, offset
            buffer = buffer[pos:]
            if eof:
                return
            chunk = fh.read(CHUNK_BYTES)
            eof = not chunk
            buffer += decoder.decode(chunk, final=eof)


def _segment_start(event: dict) -> int | None:
    """The wall-clock start (µs) that Horovod writes as the first event (process 0's name) of
    each trace it starts; ``None`` for any other event."""
    if event.get("ph") == "M" and event.get("name") == "process_name" and event.get("pid") == 0:
        start = (event.get("args") or {}).get("start_time_since_epoch_in_micros")
        if isinstance(start, (int, float)):
            return int(start)
    return None


def _join_segments(path: str | os.PathLike) -> None:
    """Rewrite a trace of several arrays as one: each later array's times shifted by how much
    later it started, and its tensor ids (``pid``) moved past the ids already used."""
    tmp = f"{path}.joining"
    first_start = None
    ts_shift = pid_shift = 0
    max_pid = -1
    with open(tmp, "w", encoding="utf-8") as out:
        out.write("[\n")
        written = False
        for event, _ in iter_events(path):
            start = _segment_start(event)
            if start is not None:
                if first_start is None:
                    first_start = start
                else:
                    ts_shift, pid_shift = start - first_start, max_pid + 1
            if isinstance(event.get("pid"), int):
                event["pid"] += pid_shift
                max_pid = max(max_pid, event["pid"])
            if isinstance(event.get("ts"), (int, float)):
                event["ts"] += ts_shift
            out.write((",\n" if written else "") + json.dumps(event, separators=(", ", ": ")))
            written = True
        out.write("\n]")
    os.replace(tmp, path)


def repair(path: str | os.PathLike) -> bool:
    """Make ``path`` one valid JSON array, cutting a partial last object and joining the arrays
    of an elastic job's restarts; ``True`` if it changed."""
    last_end = segments = 0
    for event, end in iter_events(path):
        last_end = end
        segments += _segment_start(event) is not None
    if segments > 1:
        _join_segments(path)
        return True
    with open(path, "r+b") as fh:
        fh.seek(last_end)
        rest = fh.read().strip()
        if rest == b"]" or (last_end == 0 and rest.replace(b" ", b"") == b"[]"):
            return False
        fh.seek(last_end)
        fh.truncate()
        fh.write(b"\n]" if last_end else b"[]")
    return True


@dataclass
class TimelineSummary:
    """Time per activity, the slowest tensors, and spans for a picture of one trace."""

    path: str
    events: int = 0
    activity_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    activity_count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    tensor_us: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    spans: list[tuple[str, str, float, float]] = field(default_factory=list)
    cycles: int = 0
    start_us: float | None = None
    end_us: float | None = None

    def slowest_tensors(self, count: int = TOP_TENSORS) -> list[tuple[str, float]]:
        return sorted(self.tensor_us.items(), key=lambda kv: -kv[1])[:count]

    def activities(self) -> list[tuple[str, float, float, int]]:
        """``(activity, ms, share %, count)``, the most time first."""
        total = sum(self.activity_us.values()) or 1.0
        return [(name, us / 1e3, 100 * us / total, self.activity_count[name])
                for name, us in sorted(self.activity_us.items(), key=lambda kv: -kv[1])]

    def __str__(self) -> str:
        span = ((self.end_us or 0) - (self.start_us or 0)) / 1e3
        lines = [f"Horovod Timeline {self.path}: {self.events} events over {span:.1f} ms"
                 f"{f', {self.cycles} cycle marks' if self.cycles else ''}", "time per activity:"]
        lines += [f"  {name:<28} {ms:10.2f} ms  {share:5.1f}%  x{count}"
                  for name, ms, share, count in self.activities()]
        lines.append("slowest tensors:")
        lines += [f"  {us / 1e3:10.2f} ms  {name}" for name, us in self.slowest_tensors()]
        lines.append(OPEN_HINT)
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # noqa: ANN001
        printer.text(str(self))

    def _repr_html_(self) -> str:
        acts = "".join(f"<tr><td>{html.escape(name)}</td><td>{ms:.2f}</td><td>{share:.1f}%</td>"
                       f"<td>{count}</td></tr>" for name, ms, share, count in self.activities())
        tensors = "".join(f"<tr><td>{html.escape(n)}</td><td>{us / 1e3:.2f}</td></tr>"
                          for n, us in self.slowest_tensors())
        return (f"<div class='hvd-timeline'><b>Horovod Timeline</b> {html.escape(self.path)}, "
                f"{self.events} events<br><b>time per activity</b><table><tr><th>activity</th>"
                f"<th>ms</th><th>share</th><th>count</th></tr>{acts}</table>"
                f"<b>slowest tensors</b><table><tr><th>tensor</th><th>ms</th></tr>{tensors}"
                f"</table>{self.svg()}<p>{html.escape(OPEN_HINT)}</p></div>")

    def svg(self, width: int = 900, lane: int = 18) -> str:
        """Top-level operations over time, one lane per slowest tensor, coloured by activity."""
        names = [n for n, _ in self.slowest_tensors()]
        if not names or self.start_us is None or self.end_us is None:
            return ""
        scale = (width - 200) / max(self.end_us - self.start_us, 1.0)
        colours = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#c62828", "#00838f", "#5d4037"]
        palette: dict[str, str] = {}
        rects = []
        for tensor, activity, begin, end in self.spans:
            if tensor not in names:
                continue
            colour = palette.setdefault(activity, colours[len(palette) % len(colours)])
            x = 200 + (begin - self.start_us) * scale
            rects.append(f"<rect x='{x:.1f}' y='{names.index(tensor) * lane + 2}' "
                         f"width='{max((end - begin) * scale, 1):.1f}' height='{lane - 4}' "
                         f"fill='{colour}'><title>{html.escape(activity)} "
                         f"{(end - begin) / 1e3:.2f} ms</title></rect>")
        labels = "".join(f"<text x='0' y='{i * lane + lane - 5}' font-size='11'>"
                         f"{html.escape(n[-30:])}</text>" for i, n in enumerate(names))
        legend = " ".join(f"<span style='color:{c}'>&#9632; {html.escape(a)}</span>"
                          for a, c in palette.items())
        return (f"<svg width='{width}' height='{len(names) * lane}'>{labels}{''.join(rects)}</svg>"
                f"<div>{legend}</div>")


OPEN_HINT = ("Open the file in Perfetto (ui.perfetto.dev, Open trace file) or in Chrome at "
             "chrome://tracing for the full picture.")


def summarize(path: str | os.PathLike) -> TimelineSummary:
    """Summarise a trace (complete or cut short) by streaming through it."""
    summary = TimelineSummary(str(path))
    tensor_names: dict[int, str] = {}
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for event, _ in iter_events(path):
        summary.events += 1
        phase, pid, ts = event.get("ph"), event.get("pid", 0), event.get("ts")
        if phase == "M" and event.get("name") == "process_name":
            tensor_names[pid] = event.get("args", {}).get("name", str(pid))
            continue
        if phase == "i":
            summary.cycles += 1
        if ts is None:
            continue
        summary.start_us = ts if summary.start_us is None else min(summary.start_us, ts)
        summary.end_us = ts if summary.end_us is None else max(summary.end_us, ts)
        if phase == "B":
            stacks[pid].append((event.get("name", "?"), ts))
        elif phase == "E" and stacks[pid]:
            name, begin = stacks[pid].pop()
            summary.activity_us[name] += ts - begin
            summary.activity_count[name] += 1
            if not stacks[pid]:
                tensor = tensor_names.get(pid, str(pid))
                summary.tensor_us[tensor] += ts - begin
                if len(summary.spans) < MAX_SPANS:
                    summary.spans.append((tensor, name, begin, ts))
    return summary


@dataclass
class TimelineSettings:
    """What ``%hvd_timeline`` turned on: where the next runs' traces go."""

    enabled: bool = False
    path: str | None = None
    mark_cycles: bool = False
    warned: bool = False

    def next_path(self, job_hint: str = "") -> Path:
        """The file the next run's trace goes to."""
        if self.path is None:
            return default_path(job_id=job_hint)
        target = Path(self.path)
        if self.path.endswith(os.sep) or target.is_dir():
            return default_path(target, job_hint)
        return target

    def __str__(self) -> str:
        if not self.enabled:
            return "Horovod Timeline is off (%hvd_timeline on [PATH] [--mark-cycles] turns it on)."
        where = self.path or "hvd_timelines/ (one timestamped file per run)"
        return (f"Horovod Timeline is on: traces go to {where}"
                f"{', marking cycles' if self.mark_cycles else ''}.")
