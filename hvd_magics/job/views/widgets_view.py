"""A live dashboard of a job in the notebook: one row per rank, a header, and each rank's log.

Widgets are changed only from the thread that runs the cell (the launcher's watch loop calls
:meth:`WidgetView.on_tick`), at most every ``REFRESH_INTERVAL_S``; events only mark what changed.
That keeps updates in the notebook's saved widget state when it is executed headless, and a rank
printing thousands of lines per second costs the browser a few messages per second.
"""
from __future__ import annotations

import collections
import html
import time
from typing import Any

from hvd_magics.events import Wire
from hvd_magics.job.job_state import JobState
from hvd_magics.job.rank_output import KEPT
from hvd_magics.job.rank_state import (DONE, FAILED, INTERRUPTED, PREEMPTED, READY, RUNNING,
                                       SHARDING_DATA, STARTING, STOPPED, WAITING)
from hvd_magics.job.records.run_record import job_title
from hvd_magics.job.readings.step_parts import StepParts
from hvd_magics.job.views.charts import charts_html
from hvd_magics.options import STALL_AFTER_S
from hvd_magics.protocol import FIRST_BUILD, OUTPUT, is_event
from hvd_magics.rank_names import TASK, rank_named, rank_spans

#: Least seconds between two refreshes of the widgets.
REFRESH_INTERVAL_S = 0.25
#: Least seconds between two redraws of the charts.
CHARTS_INTERVAL_S = 1.0
#: Lines of each rank's log kept in memory for the log viewer while the job runs (the log file
#: has them all)...
LOG_LINES_KEPT = 500
#: ...and once it ended (the dashboards of past runs stay in the kernel).
LOG_LINES_KEPT_AFTER = 100

_COLOURS = {WAITING: "#757575", READY: "#757575", SHARDING_DATA: "#1565c0", STARTING: "#1565c0",
            RUNNING: "#1565c0", DONE: "#2e7d32",
            FAILED: "#c62828", "stalled": "#ef6c00", INTERRUPTED: "#6d4c41", STOPPED: "#6d4c41",
            PREEMPTED: "#6d4c41"}
_STATE_LABELS = {WAITING: "waiting for slot", READY: "ready", SHARDING_DATA: "receiving data",
                 STARTING: "starting", RUNNING: "running",
                 DONE: "done", FAILED: "failed", INTERRUPTED: "interrupted",
                 STOPPED: "stopped", PREEMPTED: "saved, preempted"}


def widgets_available() -> bool:
    """Whether this is a Jupyter kernel with ipywidgets installed."""
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class _RankRow:
    def __init__(self, widgets: Any, rank: int, unit: str = "rank") -> None:
        width = lambda px: widgets.Layout(width=f"{px}px")  # noqa: E731
        self.name = widgets.HTML(f"<b>{unit} {rank}</b>", layout=width(170))
        self.state = widgets.HTML(layout=width(110))
        self.epoch = widgets.Label(layout=width(90))
        self.bar = widgets.IntProgress(min=0, max=1, value=0, layout=width(180))
        self.metrics = widgets.Label(layout=width(260))
        self.rate = widgets.Label(layout=width(150))  # "17,479 samples/s" was cut
        self.seen = widgets.Label(layout=width(110))
        #: Where its latest steps' time went (a bar of input, compute, communication).
        self.split = widgets.HTML(layout=width(270))
        self.box = widgets.HBox([self.name, self.state, self.epoch, self.bar, self.metrics,
                                 self.rate, self.split, self.seen])


def dashboard_box(children: list[Any], what: str) -> Any:
    """An ``ipywidgets.VBox`` of ``children`` whose plain-text form (what a saved notebook
    shows where widgets are not rendered, and what a terminal or nbconvert's text export shows)
    says ``what`` it was, instead of the widget's ``VBox(children=(...))`` repr."""
    import ipywidgets as widgets

    class Dashboard(widgets.VBox):
        def __repr__(self) -> str:
            return what

    return Dashboard(children)


def _what(job: JobState | None) -> str:
    if job is None:
        return "<hvd_magics: the live dashboard of a job (widgets); the run's summary follows>"
    return (f"<hvd_magics: the live dashboard of a job of {_size_text(job)} on {job.where} "
            "(widgets: each rank's progress, epoch timing, charts); the run's summary follows>")


class WidgetView:
    """Show a job as widgets; created and displayed on the first tick after submission.

    ``display_now``: take the dashboard's place in the output now (a background job's, whose
    first tick comes from its own thread, when another cell may be running); it is filled in
    at the first tick.
    """

    def __init__(self, display_now: bool = False, show_log: bool = True) -> None:
        #: Whether the dashboard has a pane with each rank's output (not when the cell also
        #: prints it as text: the log is shown once).
        self.show_log = show_log
        self._charts_drawn = 0.0
        self._rows: list[_RankRow] = []
        self._logs: list[collections.deque] = []
        self._last_refresh = 0.0
        self._dirty = True
        self._shown = False
        self._job: JobState | None = None
        self.box: Any = None
        self._handle: Any = None  # where the dashboard is in the output (to withdraw it)
        if display_now:
            import ipywidgets as widgets
            from IPython.display import display

            self.box = dashboard_box([widgets.HTML("starting the job ...")], _what(None))
            self._handle = display(self.box, display_id=True)

    def _build(self, job: JobState) -> None:
        import ipywidgets as widgets
        from IPython.display import display

        self._job = job
        self.header = widgets.HTML()
        self._rows = [_RankRow(widgets, r, job.unit) for r in range(job.size)]
        self._logs = [collections.deque(maxlen=LOG_LINES_KEPT) for _ in range(job.size)]
        self.log_rank = widgets.Dropdown(options=[(f"{job.unit} {r}", r) for r in range(job.size)],
                                         description="log of", layout=widgets.Layout(width="200px"))
        self.log = widgets.Textarea(layout=widgets.Layout(width="100%", height="160px"),
                                    disabled=True)
        self.log_rank.observe(lambda _change: self._show_log(), names="value")
        self.charts = widgets.HTML()
        children = [self.header, *[row.box for row in self._rows], self.charts]
        if self.show_log:
            children += [widgets.HBox([self.log_rank]), self.log]
        if self.box is not None:  # its place was taken when the job started
            self.box.children = children
        else:
            self.box = dashboard_box(children, _what(job))
            self._handle = display(self.box, display_id=True)
        self._shown = True

    def on_event(self, job: JobState, event: Wire) -> None:
        self._dirty = True
        if is_event(event) and event["kind"] == OUTPUT and self._logs:
            rank = event.get("rank")
            if rank is not None:  # every rank's output names it
                self._logs[rank].extend(event.get(KEPT, []))

    def on_tick(self, job: JobState) -> None:
        if not self._shown:
            self._build(job)
        now = time.monotonic()
        if now - self._last_refresh >= REFRESH_INTERVAL_S:
            self._refresh(job, now, final=False)

    def on_end(self, job: JobState) -> None:
        if job.refused:  # no rank got the job: the error says it all
            self._withdraw()
            return
        if not self._shown:
            self._build(job)
        self._job = None
        self._logs = [collections.deque(log, maxlen=LOG_LINES_KEPT_AFTER) for log in self._logs]
        self._dirty = True
        self._refresh(job, time.monotonic(), final=True)

    def _withdraw(self) -> None:
        """Take the dashboard out of the cell's output (and its widgets out of the kernel)."""
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
        todo = [self.box] if self.box is not None else []
        while todo:
            widget = todo.pop()
            todo.extend(getattr(widget, "children", ()))
            widget.close()
        self._shown, self._rows, self._logs = False, [], []

    def hand_over_charts(self) -> None:
        """The run's record, shown next, draws the charts (and keeps them in the saved
        notebook): the dashboard stops drawing them, so they are shown once."""
        if self._shown:
            self.charts.value = ""
        self._charts_drawn = float("inf")

    def _show_log(self) -> None:
        lines = list(self._logs[self.log_rank.value])
        partial = self._job.ranks[self.log_rank.value].partial if self._job else ""
        self.log.value = "\n".join(lines + [partial] if partial else lines)

    def _refresh(self, job: JobState, now: float, final: bool) -> None:
        self._last_refresh = now
        elapsed = now - job.started_at
        failed = (job.outcome in ("failed", INTERRUPTED) if job.outcome else
                  any(r.state == FAILED for r in job.ranks) and job.elastic is None)
        overall = (job.outcome if job.outcome in (INTERRUPTED, PREEMPTED) else
                   "failed" if failed else
                   "done" if final else
                   "running" if any(r.state == RUNNING for r in job.ranks) else "starting")
        colour = (_COLOURS[INTERRUPTED] if overall in (INTERRUPTED, PREEMPTED) else
                  _COLOURS[FAILED] if failed
                  else _COLOURS[DONE] if final else _COLOURS[RUNNING])
        self.header.value = (f"<b>{job_title(job.engine)}</b>, {_size_text(job)} on "
                             f"{html.escape(job.where)}: <b style='color:{colour}'>{overall}</b>, "
                             f"{elapsed:.1f} s{_attempts_html(job)}{_resets_html(job)}" +
                             (f"<br>{html.escape(nodes)}" if (nodes := nodes_text(job)) else ""))
        if job.links:
            self.header.value += (f"<br><b style='color:{_COLOURS[INTERRUPTED]}'>links:</b> "
                                  f"{html.escape(job.links)}")
        if verdict := job.splits.now(job.unit):
            label = "straggler" if job.splits.current is not None else "hosts"
            self.header.value += (f"<br><b style='color:{_COLOURS[INTERRUPTED]}'>{label}:</b> "
                                  f"{html.escape(verdict)}")
        for rank, row in zip(job.ranks, self._rows):
            self._refresh_row(rank, row, now, final, job.elastic is not None, job.stall_after)
            gpu = job.splits.memory_text(rank.rank)
            row.split.value = split_bar(job.splits.latest(rank.rank),
                                        job.splits.clock_of(rank.rank)) + (
                f"<br><span style='font-size:smaller'>{html.escape(gpu)}</span>" if gpu else "")
        if job.history.changed_at > self._charts_drawn and (
                final or now - self._charts_drawn >= CHARTS_INTERVAL_S):
            self._charts_drawn = now
            self.charts.value = charts_html(job.history)
        if self._dirty and self.show_log:
            self._show_log()
            self._dirty = False

    @staticmethod
    def _refresh_row(rank: Any, row: _RankRow, now: float, final: bool,
                     elastic: bool = False, stall_after: float = STALL_AFTER_S) -> None:
        silent = now - rank.last_seen
        state = rank.state
        label = _STATE_LABELS[state]
        if state in (WAITING, READY) and final:
            state, label = (WAITING, "not needed") if elastic else (FAILED, _STATE_LABELS[FAILED])
        stalled = None if final else rank.stalled_for(now, stall_after)
        if stalled is not None and rank.tail and rank.tail[-1].startswith(FIRST_BUILD):
            label = f"building an extension, {stalled:.0f} s"  # as it said: no word until built
        elif stalled is not None:
            label, state = f"stalled {stalled:.0f} s", "stalled"
            if rank.stalled_at:
                label += (f"</b> <span style='font-weight:normal'>in "
                          f"{html.escape(rank.stalled_at)}</span><b>")
        if elastic:
            as_rank = f" = {rank_named(rank.hvd_rank)}" if rank.hvd_rank is not None and \
                rank.state != FAILED else ""
            row.name.value = (f"<b>{rank_named(rank.rank, TASK)}{as_rank}</b> "
                              f"{html.escape(rank.host)}")
        else:
            row.name.value = f"<b>{rank_named(rank.rank)}</b> {html.escape(rank.host)}"
        row.state.value = f"<b style='color:{_COLOURS[state]}'>{label}</b>"
        row.epoch.value = (f"epoch {rank.epoch}/{rank.epochs or '?'}" if rank.epoch else "")
        total = rank.steps or 0
        if total:
            row.bar.max = total
            row.bar.value = min(rank.step, total)
        elif rank.epochs:
            row.bar.max, row.bar.value = rank.epochs, min(rank.epoch, rank.epochs)
        if rank.state == DONE:
            row.bar.max = row.bar.max or 1
            row.bar.value = row.bar.max
        row.bar.bar_style = {DONE: "success", FAILED: "danger", INTERRUPTED: "warning",
                             STOPPED: "warning", PREEMPTED: "warning"}.get(rank.state, "info")
        row.metrics.value = "  ".join(f"{k} {v:.4g}" for k, v in list(rank.metrics.items())[:4])
        row.rate.value = f"{rank.samples_per_s:,.0f} samples/s" if rank.samples_per_s else ""
        row.seen.value = "" if rank.exited or final else f"seen {silent:.0f} s ago"


#: The colours of a step's parts in a rank's split bar: input, compute, communication.
SPLIT_COLOURS = ("#8e24aa", "#1e88e5", "#fb8c00")


def split_bar(parts: StepParts | None, clock: str = "") -> str:
    """A rank's latest steps as a bar of input, compute and communication, with their
    shares after ``clock`` (whose clock a GPU rank's are), ``""`` before it reported a step."""
    if parts is None or parts.step_s <= 0:
        return ""
    widths = [100 * value / parts.step_s for value in (parts.input_s, parts.compute_s,
                                                       parts.comm_s)]
    cells = "".join(f"<span style='display:inline-block;height:9px;width:{w * 0.8:.1f}px;"
                    f"background:{colour}'></span>"
                    for w, colour in zip(widths, SPLIT_COLOURS) if w >= 0.5)
    shares = html.escape(parts.shares(clock))
    return (f"<span title='{shares} of a {parts.step_s:.3g} s step'>"
            f"{cells}</span> <span style='font-size:smaller;white-space:nowrap'>{shares}</span>")


def _size_text(job: JobState) -> str:
    """``"4 ranks"``; for an elastic job ``"3 ranks (elastic 2:4)"``."""
    size = job.current_size if job.formations or job.elastic is None else 0
    text = f"{size} rank" + ("" if size == 1 else "s")
    return text if job.elastic is None else f"{text} (elastic {job.elastic})"


#: Above this many ranks the dashboard's header also lists the nodes and their ranks.
NODES_LISTED_ABOVE = 4


def nodes_text(job: JobState) -> str:
    """``"2 nodes: 10.0.0.1 ranks 0-7, 10.0.0.2 ranks 8-15"`` once the ranks' hosts are known
    (``""`` for a few ranks, or before any host is): the ranks grouped by node."""
    if job.size <= NODES_LISTED_ABOVE or job.elastic is not None:
        return ""
    nodes: dict[str, list[int]] = {}
    for rank in job.ranks:
        if rank.host:
            nodes.setdefault(rank.host, []).append(rank.rank)
    if not nodes:
        return ""

    listed = ", ".join(f"{host} {rank_spans(ranks)}" for host, ranks in nodes.items())
    return f"{len(nodes)} node{'s' if len(nodes) > 1 else ''}: {listed}"


def _attempts_html(job: JobState) -> str:
    """A restarted job: which attempt this is, and why each earlier one ended."""
    if not job.earlier_attempts:
        return ""
    return f", attempt {len(job.earlier_attempts) + 1}" + "".join(
        f"<br>attempt {i} ended: {html.escape(cause)}"
        for i, cause in enumerate(job.earlier_attempts, 1))


def _resets_html(job: JobState) -> str:
    """Each reset of an elastic job and its cause, one line each."""
    from hvd_magics.job.records.run_record import describe_reset

    return "".join(f"<br>reset {r['reset']}: {html.escape(describe_reset(r))}"
                   for r in job.resets)
