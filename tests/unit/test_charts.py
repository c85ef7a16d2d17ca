"""The job's charts: drawn from progress events as inline SVG, live and in the record."""
import xml.etree.ElementTree as ET
from pathlib import Path

from hvd_magics.job.readings.metric_history import MetricHistory
from hvd_magics.job.views.charts import charts_html, svg_chart
from hvd_magics.job.job_state import JobState
from hvd_magics.job.records.run_record import RunRecord


def _progress(rank, epoch, step, loss, rate):
    return {"kind": "progress", "rank": rank, "host": "h", "epoch": epoch, "step": step,
            "steps": 10, "samples_per_s": rate, "metrics": {"loss": loss, "accuracy": 1 - loss}}


def _feed(job: JobState) -> None:
    for rank in (0, 1):
        job.handle({"kind": "started", "rank": rank, "host": "h", "pid": 1})
    for epoch in (1, 2):
        for step in range(1, 11):
            for rank in (0, 1):
                job.handle(_progress(rank, epoch, step, 1.0 / (epoch * step), 100.0 + rank * 50))
        job.handle({"kind": "epoch_end", "rank": 0, "host": "h", "epoch": epoch, "epochs": 2,
                    "duration": 1.0, "samples": 100,
                    "metrics": {"loss": 0.5 / epoch, "val_loss": 0.6 / epoch}})


def test_progress_events_become_charts_of_steps_epochs_and_rates(tmp_path: Path):
    job = JobState(2, tmp_path / "ranks.log")
    _feed(job)
    history = job.history
    assert [x for x, _ in history.steps["loss"]] == [float(i) for i in range(1, 21)]
    assert history.epochs["val_loss"] == [(1.0, 0.6), (2.0, 0.3)]
    assert set(history.rates) == {0, 1} and history.rates[1][-1][1] == 150.0
    page = charts_html(history)
    assert page.count("<svg") == 4  # loss and accuracy per step, per epoch, samples/s
    for svg in page.split("<svg")[1:]:
        ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")  # each one is valid XML
    assert "val_loss" in page and "stroke-dasharray" in page and "rank 1" in page
    job.end()


def test_a_record_keeps_its_charts_for_saved_notebooks(tmp_path: Path):
    job = JobState(2, tmp_path / "ranks.log")
    _feed(job)
    record = RunRecord(job_id="x", np=2, charts_html=charts_html(job.history))
    assert "<svg" in record._repr_html_() and "charts_html" not in repr(record)
    assert "<svg" not in str(record)  # the text summary stays text
    job.end()


def test_nothing_reported_draws_nothing_and_one_point_is_a_dot():
    assert charts_html(MetricHistory(0.0)) == ""
    assert "<circle" in svg_chart({"loss": [(1.0, 0.5)]}, "t", "epoch")


def test_the_dashboard_draws_charts_and_shows_the_log_once(tmp_path: Path):
    from hvd_magics.job.views.widgets_view import WidgetView

    with_text, alone = WidgetView(show_log=False), WidgetView()
    job = JobState(2, tmp_path / "ranks.log", [with_text, alone])
    job.tick()
    _feed(job)
    job.end()
    assert "<svg" in with_text.charts.value and with_text.log not in with_text.box.children
    assert alone.log in alone.box.children


def test_ticks_close_together_are_labelled_apart_and_one_epoch_draws_no_epoch_chart():
    """Seen in JupyterLab: a loss chart's y-axis said 2.32 three times, and a one-epoch loop
    drew a per-epoch chart of one dot."""
    import re


    chart = svg_chart({"loss": [(1, 2.3151), (2, 2.3156), (3, 2.3153)]}, "loss", "step")
    labels = re.findall(r"text-anchor='end'>([^<]+)</text>", chart)
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
    history = MetricHistory(0.0)
    history.epochs = {"loss": [(1.0, 0.5)]}
    assert "per epoch" not in charts_html(history)
    history.epochs = {"loss": [(1.0, 0.5), (2.0, 0.4)]}
    assert "per epoch" in charts_html(history)


def test_values_equal_but_for_the_last_bit_draw_one_tick_not_an_error():
    """A Keras job on two driver ranks failed as it ended (suite, stop 77): its chart's values
    were 328.21999999999997 and 328.22, the ticks between them repeated one float, and the
    labels' spacing took the logarithm of 0 (``ValueError: math domain error``)."""
    import re

    chart = svg_chart({"[0]": [(1, 328.21999999999997), (2, 328.22)],
                       "[1]": [(1, 328.22), (2, 328.22)]}, "seconds", "step")
    labels = re.findall(r"text-anchor='end'>([^<]+)</text>", chart)
    # drawn as one flat value is (its axis half of it either side)
    assert labels == ["200", "300", "400"], labels
