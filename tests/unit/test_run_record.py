"""The run record and the job error print well."""
from datetime import timedelta

from hvd_magics.errors import HorovodJobError, RankFailure
from hvd_magics.job.records.run_record import RunRecord


def test_record_text_and_html():
    rec = RunRecord(job_id="abc", np=2, where="spark local[2]", status="succeeded",
                    exit_codes={0: 0, 1: 0}, value=42, log_path="/tmp/x/ranks.log")
    rec.ended_at = rec.started_at + timedelta(seconds=3.5)
    text = str(rec)
    assert "succeeded" in text and "3.50 s" in text and "0:0, 1:0" in text and "42" in text
    assert "<table>" in rec._repr_html_() and "#2e7d32" in rec._repr_html_()
    assert rec.wall_time_s == 3.5 and rec.size == 2


def test_job_error_labels_each_rank_and_caps_how_many_it_shows():
    failures = [RankFailure(r, "h", 1, "ValueError", f"bad {r}", "Traceback...\nValueError: bad",
                            ["out a", "out b"]) for r in range(6)]
    err = HorovodJobError("6 of 6 ranks failed", failures, "/tmp/log")
    lines = err._render_traceback_()
    assert lines[0] == "HorovodJobError: 6 of 6 ranks failed"
    assert any(l.startswith("[rank 3] Traceback") for l in lines)
    assert "[rank 0]   out b" in lines
    assert not any(l.startswith("[rank 4]") for l in lines)
    assert any("ranks 4, 5 failed too" in l for l in lines)
    assert "... and 2 more ranks" in str(err)


def test_a_rank_killed_by_a_signal_says_so():
    assert "killed by signal 9" in RankFailure(1, "h", -9).headline()
    assert "exited with code 3 without a Python exception" in RankFailure(1, "h", 3).headline()


def test_one_error_of_every_rank_is_said_once():
    """The wrong-engine error was shown five times: in the summary, once per rank, and as the
    last line of each rank's traceback."""
    message = "hvd.init() was called, but this job runs on the torch engine. Fix: ..."
    trace = ("Traceback (most recent call last):\n  File \"cell\", line 2, in <module>\n"
             f"    hvd.init()\nhvd_magics.rank.guards.engine_guard.WrongEngineError: {message}")
    failures = [RankFailure(r, "h", 1, "WrongEngineError", message, trace, [f"out {r}"])
                for r in range(2)]
    failures.append(RankFailure(2, "h", 1, "ValueError", "other", "Traceback...\nValueError: other"))
    err = HorovodJobError(f"3 of 3 ranks failed; the first was {failures[0].headline()}",
                          failures, "/tmp/log")
    rendered = "\n".join(err._render_traceback_())
    assert rendered.count(message) == 1, rendered
    assert rendered.startswith("HorovodJobError: 3 of 3 ranks failed; the first was rank 0 on h: "
                               "WrongEngineError (its traceback below)\n"), rendered
    assert "[rank 0]     hvd.init()" in rendered  # where it was called, still shown
    assert f"[rank 0] hvd_magics.rank.guards.engine_guard.WrongEngineError: {message}" in rendered
    assert "[rank 1] rank 1 on h: the same WrongEngineError" in rendered
    assert "[rank 1]   out 1" in rendered  # each rank's own output stays
    assert "[rank 2] rank 2 on h: ValueError: other" in rendered
    assert "[rank 2] ValueError: other" in rendered  # another error keeps its traceback
    assert str(err).count(message) == 1 and "rank 1 on h: the same WrongEngineError" in str(err)


def test_a_ranks_own_exception_can_be_raised_again_as_its_type():
    """So that ``except ValueError`` around a job works (ipyparallel's raise_exception)."""
    import pytest

    failures = [RankFailure(1, "h", 1, "ValueError", "bad shape", "Traceback...\nValueError: "
                            "bad shape"),
                RankFailure(0, "h", 1, "ShardError", "no column",
                            "Traceback...\nhvd_magics.errors.ShardError: no column"),
                RankFailure(2, "h", 1, "Mystery", "?", "Traceback...\nnowhere.Mystery: ?"),
                RankFailure(3, "h", -9)]
    err = HorovodJobError("4 of 4 ranks failed", failures)
    with pytest.raises(ValueError, match="bad shape") as info:
        err.raise_exception()
    assert info.value.__cause__ is err
    from hvd_magics.errors import ShardError

    with pytest.raises(ShardError, match="no column"):
        err.raise_exception(1)
    for index in (2, 3):  # a type not imported here, a rank killed without one
        with pytest.raises(HorovodJobError):
            err.raise_exception(index)


def test_a_torch_or_tf_job_is_called_by_its_engine_not_horovod(tmp_path):
    """A torch job's dashboard said "Horovod job" and its record "HorovodRun succeeded"."""
    from hvd_magics.job.job_state import JobState
    from hvd_magics.job.views.widgets_view import WidgetView

    for engine, title, run in (("torch", "torch.distributed job", "torch.distributed run"),
                               ("tf", "tf.distribute job", "tf.distribute run"),
                               ("horovod", "Horovod job", "HorovodRun")):
        record = RunRecord(job_id="x1", np=2, where="spark local[2]", log_path="l",
                           engine=engine, status="succeeded")
        assert str(record).startswith(f"{run} x1") and f">{run} succeeded</b>" in \
            record._repr_html_()
        job = JobState(2, tmp_path / engine / "ranks.log", where="spark local[2]", engine=engine)
        view = WidgetView()
        view.on_end(job)  # outside a kernel, display() prints the box's repr
        assert view.header.value.startswith(f"<b>{title}</b>, 2 ranks on spark local[2]"), \
            view.header.value


def test_the_end_of_a_job_waits_longer_for_mlflows_own_store_than_for_a_server():
    """A first run into MLflow's local default store (sqlite) spent more than the 20 s kept for
    a server that does not answer making its tables, on a slow machine: the run was left
    without its id. A store this process writes is waited for longer."""
    from hvd_magics.job.records.mlflow_run import local_store

    assert all(local_store(uri) for uri in ("sqlite:////tmp/x/mlflow.db", "file:///tmp/mlruns",
                                            "/tmp/mlruns", "mlruns", "C:\\runs"))
    assert not any(local_store(uri) for uri in ("http://127.0.0.1:5000", "https://mlflow.example",
                                                "databricks", "postgresql://h/db"))
