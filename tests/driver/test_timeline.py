"""Horovod Timeline: recorded on rank 0, brought to the driver, valid even after a failure."""
import json

import pytest

from hvd_magics import HorovodJobError, HorovodPool, HorovodRunner, last_run
from hvd_magics.job.records.timeline import repair, summarize
from tests import jobs


def test_a_real_two_rank_tensorflow_job_yields_a_valid_trace_with_allreduce(tmp_path):
    path = tmp_path / "trace.json"
    HorovodRunner(np=-2, timeline=path).run(jobs.tf_allreduce)
    assert last_run().timeline_path == str(path)
    events = json.loads(path.read_text())
    names = {e.get("name") for e in events}
    assert "ALLREDUCE" in names and "NEGOTIATE_ALLREDUCE" in names
    summary = summarize(path)
    assert summary.activity_us["ALLREDUCE"] > 0 and summary.tensor_us
    assert "<svg" in summary._repr_html_() and "chrome://tracing" in str(summary)


def test_a_failed_run_still_leaves_a_readable_trace(tmp_path):
    path = tmp_path / "failed.json"
    with pytest.raises(HorovodJobError):
        HorovodRunner(np=-2, timeline=path).run(jobs.torch_allreduce_steps, steps=30, fail=True)
    assert last_run().timeline_path == str(path)
    events = json.loads(path.read_text())  # valid JSON although rank 0 was killed
    assert any(e.get("name") == "ALLREDUCE" for e in events)


def test_a_truncated_trace_is_summarised_and_repaired(tmp_path):
    path = tmp_path / "t.json"
    HorovodRunner(np=-2, timeline=path).run(jobs.torch_allreduce_steps, steps=30)
    whole = summarize(path)
    text = path.read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: int(len(text) * 0.7)])
    partial = summarize(cut)
    assert 0 < partial.events < whole.events and partial.activity_us
    assert repair(cut) is True
    assert len(json.loads(cut.read_text())) == partial.events


def test_the_timeline_magic_records_shows_and_turns_off(ip, tmp_path, capsys):
    ip.run_line_magic("hvd_timeline", f"on {tmp_path}/ --mark-cycles")
    out = capsys.readouterr().out
    assert "40% lower Inception3 throughput" in out and "marking cycles" in out
    ip.run_cell_magic("horovod", "np=-2 -q",
                      "import horovod.torch as hvd, torch\nhvd.init()\n"
                      "[hvd.allreduce(torch.ones(10), name='g') for _ in range(5)]\n")
    traces = list(tmp_path.glob("timeline-*.json"))
    assert len(traces) == 1
    summary = ip.run_line_magic("hvd_timeline", "show")
    assert summary.path == str(traces[0]) and "ALLREDUCE" in summary.activity_us
    ip.run_line_magic("hvd_timeline", "off")
    ip.run_cell_magic("horovod", "np=-1 -q", "1\n")
    assert len(list(tmp_path.glob("timeline-*.json"))) == 1
    ip.run_line_magic("hvd_timeline", "")
    assert "Horovod Timeline is off" in capsys.readouterr().out


def test_each_rank_writes_to_its_own_temporary_trace(tmp_path):
    paths = HorovodRunner(np=-2, timeline=tmp_path / "x.json").run(jobs.timeline_paths)
    assert len(set(paths)) == 2 and all(p and p.endswith(".json") for p in paths)


def _trace_tensors(path) -> set[str]:
    events = json.loads(path.read_text())  # valid JSON
    return {e["args"]["name"].split(".", 1)[-1] for e in events
            if e.get("name") == "process_name" and "name" in e.get("args", {})}


def test_a_warm_pool_records_a_timeline_per_cell_that_asks_for_one(tmp_path):
    with HorovodPool(np=-2) as pool:
        # the cell that calls hvd.init() first: its init opens the trace
        HorovodRunner(np=-2, timeline=tmp_path / "first.json", pool=pool).run(
            jobs.torch_allreduce_steps, steps=10, name="first")
        pool.run(jobs.torch_allreduce_steps, steps=10, name="untraced")
        # Horovod runs already: the trace is started and stopped around the cell
        HorovodRunner(np=-2, timeline=tmp_path / "third.json", pool=pool).run(
            jobs.torch_allreduce_steps, steps=10, name="third")
        assert last_run().timeline_path == str(tmp_path / "third.json")
        assert pool.run(jobs.environment_value, name="HOROVOD_TIMELINE") == "DYNAMIC"
    first, third = _trace_tensors(tmp_path / "first.json"), _trace_tensors(tmp_path / "third.json")
    assert {"first_0", "first_1", "first_2"} <= first and not any("untraced" in t for t in first)
    assert {"third_0", "third_1", "third_2"} <= third
    assert not any(t.startswith(("first", "untraced")) for t in third)
    assert "ALLREDUCE" in summarize(tmp_path / "third.json").activity_us
    assert not list(tmp_path.glob("untraced*"))


def test_hvd_timeline_show_reads_the_trace_of_a_warm_pools_cell(ip, tmp_path, capsys):
    ip.run_line_magic("hvd_timeline", f"on {tmp_path}/")
    ip.run_line_magic("hvd_pool", "start np=-2")
    try:
        ip.run_cell_magic("horovod", "-q", "import horovod.torch as hvd, torch\nhvd.init()\n"
                                           "[hvd.allreduce(torch.ones(10), name='g') for _ in range(5)]\n")
        summary = ip.run_line_magic("hvd_timeline", "show")
        assert "ALLREDUCE" in summary.activity_us
        assert "without it" not in capsys.readouterr().out
    finally:
        ip.run_line_magic("hvd_pool", "stop")
        ip.run_line_magic("hvd_timeline", "off")
