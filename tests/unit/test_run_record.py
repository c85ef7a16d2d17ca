"""The run record and the job error print well."""
from datetime import timedelta

from hvd_magics.errors import HorovodJobError, RankFailure
from hvd_magics.job.run_record import RunRecord


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
