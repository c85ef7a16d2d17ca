"""Synthetic events through the text and widget views; result values; noise; GPU mapping."""
import io
import re
import sys
import time
from pathlib import Path

import pytest

from hvd_magics.task import gpus
from hvd_magics.job.job_state import JobState
from hvd_magics.options import STALL_AFTER_S
from hvd_magics.job.readings.noise import is_noise
from hvd_magics.task.supervisor import terminal_text
from hvd_magics.result_codec import (Parts, RemoteValue, ResultDecodeError, decode_guarded,
                                     decode_strict, encode_parts)
from hvd_magics.options import VERBOSITY_DEBUG
from hvd_magics.job.views.text_view import MAX_LINES_PER_FLUSH, TextView

TF_STARTUP = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795310184.077076    4490 port.cc:153] oneDNN custom operations are on. You may "
    "see slightly different numerical results",
    "I0000 00:00:1795310184.077407    4490 cudart_stub.cc:31] Could not find cuda drivers on your "
    "machine, GPU will not be used.",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
    "E0000 00:00:1795310186.071591    4490 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "/job:worker/replica:0/task:1",
    # torch's store on hosts whose peers' addresses have no name (issue 58)
    "[W1127 15:14:12.686415403 socket.cpp:207] [c10d] The hostname of the client socket cannot "
    "be retrieved. err=-3",
]


def _job(tmp_path: Path, size: int = 2, views=()) -> JobState:
    return JobState(size, tmp_path / "ranks.log", list(views), "test")


def _output(rank: int, *lines: str) -> dict:
    return {"kind": "output", "rank": rank, "host": "h", "lines": list(lines)}


def test_framework_startup_lines_are_noise_and_user_lines_are_not():
    assert all(is_noise(line) for line in TF_STARTUP)
    for line in ["Epoch 1/3", "E0000 my own message", "loss: 0.3", "WARNING: your data is odd",
                 "E0000 00:00:1.2  1 foo.cc:3] a real error"]:
        assert not is_noise(line), line


def test_a_lost_peers_word_is_hidden_once_a_rank_failed(tmp_path):
    """Rank 0's Horovod loop says its peer went away when rank 1 failed: rank 1's own error says
    it better, so the cell hides the line from then on (before, it is shown: it may be all
    there is)."""
    line = ("[2026-11-24 10:00:00.000000: E /tmp/horovod/common/operations.cc:697] [0]: Horovod "
            "background loop uncaught exception: [/tmp/gloo/pair.cc:589] Read error "
            "[127.0.0.1]:1234: Connection reset by peer")
    shown = {}
    for failed_first in (False, True):
        out = io.StringIO()
        job = _job(tmp_path / str(failed_first), views=[TextView("all", stream=out)])
        if failed_first:
            job.handle({"kind": "error", "rank": 1, "host": "h", "error": "ValueError",
                        "message": "boom", "traceback": "ValueError: boom\n"})
        assert job.peer_lost is failed_first
        job.handle(_output(0, line, "a line of the user's"))
        job.end()
        assert "[0] a line of the user's" in out.getvalue()
        shown[failed_first] = "background loop" in out.getvalue()
    assert shown == {False: True, True: False}


def test_the_text_view_hides_noise_unless_asked_and_the_log_keeps_it(tmp_path):
    for verbosity, shown in (("all", False), (VERBOSITY_DEBUG, True)):
        out = io.StringIO()
        job = _job(tmp_path / verbosity, views=[TextView(verbosity, stream=out)])
        job.handle(_output(0, *TF_STARTUP, "hello"))
        job.end()
        assert "[0] hello" in out.getvalue()
        assert ("cuInit" in out.getvalue()) is shown
        assert "cuInit" in (tmp_path / verbosity / "ranks.log").read_text()


def test_a_flood_keeps_the_first_and_the_last_lines(tmp_path):
    out = io.StringIO()
    job = _job(tmp_path, 1, [TextView(stream=out)])
    total = 5 * MAX_LINES_PER_FLUSH
    job.handle(_output(0, *[f"line {i}" for i in range(total)]))
    job.end()
    text = out.getvalue()
    assert "[0] line 0\n" in text and f"[0] line {total - 1}\n" in text  # the result line
    assert f"... {total - MAX_LINES_PER_FLUSH:,} more lines not shown" in text
    assert text.count("\n") == MAX_LINES_PER_FLUSH + 1


def test_a_flood_from_two_ranks_shows_each_ranks_last_lines(tmp_path):
    """One tail for both ranks: rank 0's flood pushed rank 1's last lines out (7 runs of 8)."""
    out = io.StringIO()
    job = _job(tmp_path, 2, [TextView(stream=out)])
    for block in range(40):
        for rank in (1, 0):
            job.handle(_output(rank, *[f"r{rank} line {block * 1000 + i}" for i in range(1000)]))
    job.handle(_output(1, "r1 the end"))
    job.handle(_output(0, *[f"r0 more {i}" for i in range(2000)], "r0 the end"))
    job.end()
    text = out.getvalue()
    assert "[1] r1 the end\n" in text and "[0] r0 the end\n" in text
    assert "[1] r1 line 39999\n" in text  # rank 1's lines before its last one too
    assert re.search(r"\.\.\. [\d,]+ more lines not shown here \(rank 0: [\d,]+, rank 1: [\d,]+;",
                     text), text[:3000]
    assert text.count("\n") <= MAX_LINES_PER_FLUSH + 2
    assert text.index("[1] r1 the end") < text.index("[0] r0 more 1999")  # arrival order


def test_two_ranks_progress_bars_are_live_on_one_line(tmp_path):
    """Only rank 0's bar was redrawn; rank 1's appeared when its line ended."""
    out = io.StringIO()
    view = TextView(stream=out)
    job = _job(tmp_path, 2, [view])
    for pct in (10, 50):
        for rank in (0, 1):
            job.handle({"kind": "output_partial", "rank": rank, "host": "h",
                        "text": f"{pct + rank}%|###"})
        view._flush(job)
    job.handle(_output(0, "rank 0 done"))
    view._flush(job)
    job.handle(_output(1, "rank 1 done"))
    job.end()
    text = out.getvalue()
    assert text.startswith("\r[0] 10%|###  [1] 11%|###\r[0] 50%|###  [1] 51%|###")
    # a finished line is drawn over the bars; the bars still running come back below it
    assert "\r[0] rank 0 done".ljust(len("\r[0] 50%|###  [1] 51%|###")) + "\n\r[1] 51%|###" in text
    assert text.endswith("[1] rank 1 done\n")


def test_a_progress_bar_is_redrawn_in_place_and_replaced_by_its_line(tmp_path):
    out = io.StringIO()
    view = TextView(stream=out)
    job = _job(tmp_path, 1, [view])
    for pct in (10, 50):
        job.handle({"kind": "output_partial", "rank": 0, "host": "h", "text": f"{pct}%|###"})
        view._flush(job)
    job.handle(_output(0, "100%|#####"))
    job.end()
    assert out.getvalue() == "\r[0] 10%|###\r[0] 50%|###\r[0] 100%|#####\n"
    assert terminal_text(b"10%\r50%\r100%\r") == "100%"


def test_a_silent_rank_is_said_to_stall_in_the_text_view(tmp_path):
    out = io.StringIO()
    view = TextView(stream=out)
    job = _job(tmp_path, 2, [view])
    for rank in (0, 1):
        job.handle({"kind": "started", "rank": rank, "host": "h", "pid": 1})
    job.ranks[1].last_seen -= STALL_AFTER_S + 5
    job.tick()
    view._flush(job)
    assert "no output" not in out.getvalue()  # it waits a moment for where the rank is
    frames = [["/home/me/train.py", 7, "slow_down", "time.sleep(1000)", "user"],
              ["/usr/lib/python3.11/x.py", 1, "inner", "", "library"]]
    job.handle({"kind": "stacks", "rank": 1, "host": "h", "request": "stall-1", "others": 0,
                "threads": [{"name": "MainThread", "main": True, "frames": frames}]})
    job.tick()
    view._flush(job)
    assert ("[1] no output or progress for 6" in out.getvalue()
            and "in /home/me/train.py:7 slow_down (time.sleep(1000)), in" in out.getvalue())
    assert "[0] no output" not in out.getvalue()
    job.handle(_output(1, "back"))
    job.tick()
    job.end()
    assert "[1] active again after" in out.getvalue()
    assert "silent for 60 s, in /home/me/train.py:7" in (tmp_path / "ranks.log").read_text()


def test_long_lines_are_cut_for_display_and_whole_in_the_log(tmp_path):
    out = io.StringIO()
    job = _job(tmp_path, 1, [TextView(stream=out)])
    job.handle(_output(0, "y" * 5_000_000))
    job.end()
    assert len(out.getvalue()) < 10_000 and "5,000,000 characters" in out.getvalue()
    assert len(job.ranks[0].tail[0]) < 10_000
    assert (tmp_path / "ranks.log").read_text().count("y") == 5_000_000


def test_finished_dashboards_keep_little(tmp_path):
    """Five runs that printed a 20 MB line grew the kernel by 300 MB: widgets kept every line."""
    from hvd_magics.job.views.widgets_view import LOG_LINES_KEPT_AFTER, WidgetView

    view = WidgetView()
    job = _job(tmp_path, 2, [view])
    job.tick()
    for i in range(400):
        job.handle(_output(i % 2, f"line {i} " + "z" * 100_000))
    job.end()
    kept = sum(len(line) for log in view._logs for line in log)
    assert all(len(log) <= LOG_LINES_KEPT_AFTER for log in view._logs)
    assert kept < 2 * LOG_LINES_KEPT_AFTER * 3000


def test_a_saved_dashboard_says_in_plain_text_what_it_was(tmp_path):
    """A notebook opened where widgets do not render showed VBox(children=(HTML(value=''), ..."""
    from hvd_magics.job.views.widgets_view import WidgetView

    view = WidgetView()
    job = _job(tmp_path, 2, [view])
    job.tick()
    bundle = view.box._repr_mimebundle_()
    text = bundle["text/plain"] if isinstance(bundle, dict) else bundle[0]["text/plain"]
    assert text.startswith("<hvd_magics: the live dashboard of a job of 2 ranks on ")
    assert "VBox" not in text
    assert "application/vnd.jupyter.widget-view+json" in (
        bundle if isinstance(bundle, dict) else bundle[0])
    job.end()
    one = WidgetView()
    alone = _job(tmp_path, 1, [one])
    alone.tick()
    assert "a job of 1 rank on " in repr(one.box)
    alone.end()


def test_the_dashboard_groups_many_ranks_by_node(tmp_path):
    from hvd_magics.job.views.widgets_view import WidgetView, nodes_text

    view = WidgetView()
    job = _job(tmp_path, 6, [view])
    assert nodes_text(job) == ""  # no host known yet
    for rank, host in enumerate(["a", "a", "a", "b", "b", "a"]):
        job.ranks[rank].host = host
    assert nodes_text(job) == "2 nodes: a ranks 0-2, 5, b ranks 3-4"
    job.tick()
    job.end()
    assert "2 nodes: a ranks 0-2, 5, b ranks 3-4" in view.header.value
    few = _job(tmp_path, 2, [])
    few.ranks[0].host = few.ranks[1].host = "a"
    assert nodes_text(few) == ""  # two rows say it already


def test_values_decode_strictly_or_stay_on_the_rank_with_their_repr():
    parts = encode_parts(Parts(value=[1, 2], **{"return:x": {"a": 1}}))
    assert decode_strict("value", parts["value"]) == [1, 2]
    assert decode_guarded("value", parts["value"], "hint") == [1, 2]
    assert decode_strict("return:x", parts["return:x"]) == {"a": 1}
    unpicklable = encode_parts(x for x in [])["value"]
    kept = decode_guarded("value", unpicklable, "Use --return.")
    assert isinstance(kept, RemoteValue) and "generator" in repr(kept)
    with pytest.raises(ResultDecodeError, match="a generator.*cannot be pickled"):
        decode_strict("value", unpicklable)


def test_a_value_that_would_import_a_framework_stays_on_the_rank():
    """A cell ending in model.fit(...) must not import TensorFlow into the notebook."""
    fake = type(sys)("fakeframework_hvd")
    sys.modules[fake.__name__] = fake

    class History:
        pass

    History.__module__ = fake.__name__
    History.__qualname__ = "History"
    fake.History = History
    try:
        parts = encode_parts(History())
    finally:
        del sys.modules[fake.__name__]
    value = decode_guarded("value", parts["value"], "Use --return NAME.")
    assert isinstance(value, RemoteValue)
    assert "fakeframework_hvd.History" in value.reason and "would import fakeframework_hvd" in value.reason
    assert "fakeframework_hvd" not in sys.modules
    with pytest.raises(ResultDecodeError, match="fakeframework_hvd.History.*could not be decoded"):
        decode_strict("value", parts["value"])


def test_a_value_over_the_limit_travels_as_its_size(monkeypatch):
    monkeypatch.setenv("HVD_MAGICS_MAX_RESULT_MB", "1")
    part = encode_parts(b"x" * 2_000_000)["value"]
    assert "blob" not in part and part["too_large"]
    with pytest.raises(ResultDecodeError, match="2.0 MB pickled, over the 1 MB.*return its path"):
        decode_strict("value", part)


@pytest.mark.parametrize("indices, inherited, expected", [
    (["0", "1"], None, "0,1"),
    (["0", "1"], "2,3", "2,3"),
    (["1"], "2,3", "3"),
    ([0], "GPU-uuid-a,GPU-uuid-b", "GPU-uuid-a"),
])
def test_gpu_indices_map_through_the_inherited_list(indices, inherited, expected):
    environ = {} if inherited is None else {"CUDA_VISIBLE_DEVICES": inherited}
    assert gpus.visible_devices(indices, environ) == expected


def test_a_gpu_index_outside_the_inherited_list_is_an_error():
    with pytest.raises(ValueError, match="discovery script"):
        gpus.visible_devices(["2"], {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert gpus.local_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert gpus.local_gpu_count({"CUDA_VISIBLE_DEVICES": "4,5,6"}) == 3


def _pump(data: bytes, pool: bool = False, kinds: list | None = None
          ) -> tuple[list[str], float]:
    """Feed ``data`` through a supervisor's output pump; return the lines and the seconds
    (``kinds``: gets each event's kind, with its lines)."""
    import os
    import threading
    import types

    from hvd_magics.task.supervisor import RankProcess

    read_fd, write_fd = os.pipe()
    lines: list[str] = []
    pump = RankProcess.__new__(RankProcess)
    pump._proc = types.SimpleNamespace(stdout=types.SimpleNamespace(fileno=lambda: read_fd))
    pump._pool = pool

    def sink(event):
        lines.extend(event.get("lines", []))
        if kinds is not None:
            kinds.append((event["kind"], event.get("lines")))

    pump._sink = sink

    def feed():
        for start in range(0, len(data), 1 << 16):
            os.write(write_fd, data[start:start + (1 << 16)])
        os.close(write_fd)

    writer = threading.Thread(target=feed)
    started = time.perf_counter()
    writer.start()
    pump._pump_output()
    elapsed = time.perf_counter() - started
    writer.join()
    os.close(read_fd)
    return lines, elapsed


def test_a_long_line_goes_through_the_pump_in_linear_time():
    """An 80 MB line took 37 s: every chunk re-split everything before it (quadratic)."""
    small_lines, small = _pump(b"a" * 8_000_000 + b"\n")
    big_lines, big = _pump(b"a" * 64_000_000 + b"\n")
    assert [len(x) for x in small_lines] == [8_000_000]
    assert [len(x) for x in big_lines] == [64_000_000]
    # linear: about 8 times the small one; quadratic: about 64 times
    assert big < 24 * small + 0.5, f"8 MB took {small:.2f} s, 64 MB took {big:.2f} s"


def test_a_pool_ranks_end_of_cell_comes_after_the_cells_lines_and_is_not_shown():
    from hvd_magics.protocol import CELL_END, CELL_END_LINE, OUTPUT

    end = CELL_END_LINE.encode()
    kinds: list = []
    lines, _ = _pump(b"one\ntwo, no newline" + end + b"\nnext cell\n", pool=True, kinds=kinds)
    assert kinds == [(OUTPUT, ["one", "two, no newline"]), (CELL_END, None),
                     (OUTPUT, ["next cell"])]
    kinds.clear()
    _pump(b"cold job" + end + b"\n", pool=False, kinds=kinds)  # only a pool's rank ends cells
    assert kinds == [(OUTPUT, ["cold job" + CELL_END_LINE])]


@pytest.mark.parametrize("outcome, header, rows", [
    ("interrupted", "interrupted", ["interrupted", "interrupted"]),
    ("failed", "failed", ["failed", "stopped"]),
])
def test_the_dashboards_last_state_agrees_with_the_record(tmp_path, outcome, header, rows):
    """After an interrupt the header said 'failed' and both rows 'running, seen 1 s ago'."""
    from hvd_magics.job.views.widgets_view import WidgetView

    view = WidgetView()
    job = _job(tmp_path, 2, [view])
    job.tick()
    for rank in (0, 1):
        job.handle({"kind": "started", "rank": rank, "host": "h", "pid": 1})
    if outcome == "failed":
        job.handle({"kind": "error", "rank": 0, "host": "h", "error": "ValueError",
                    "message": "bad", "traceback": ""})
    else:
        job.handle({"kind": "exit", "rank": 0, "host": "h", "code": -9})  # killed by the stop
    job.settle(outcome)
    job.end()
    assert f">{header}</b>" in view.header.value
    assert [row.state.value.split(">")[1].split("<")[0] for row in view._rows] == rows
    assert [row.seen.value for row in view._rows] == ["", ""]


def test_a_stalled_rank_that_never_says_where_is_still_shown(tmp_path):
    out = io.StringIO()
    view = TextView(stream=out)
    job = _job(tmp_path, 1, [view])
    job.handle({"kind": "started", "rank": 0, "host": "h", "pid": 1})
    job.ranks[0].last_seen -= STALL_AFTER_S + 5
    job.tick()
    view._where_due[0] = 0.0  # its wait for the stacks is over
    job.tick()
    view._flush(job)
    assert "[0] no output or progress for 6" in out.getvalue() and ", in " not in out.getvalue()


def test_a_rank_silent_in_a_first_build_it_announced_is_said_to_build_not_to_stall(tmp_path):
    """During DeepSpeed's first build the cell said 'no output or progress for 60 s ...
    stalled?' although the rank had said it was building and that it would say nothing."""
    from hvd_magics.protocol import FIRST_BUILD

    out = io.StringIO()
    view = TextView(stream=out)
    job = _job(tmp_path, 1, [view])
    job.handle({"kind": "started", "rank": 0, "host": "h", "pid": 1})
    job.handle(_output(0, f"{FIRST_BUILD} deepspeed_shm_comm, its first use on this host"))
    job.ranks[0].last_seen -= STALL_AFTER_S + 5
    job.tick()
    view._where_due[0] = 0.0  # its wait for the stacks is over
    job.tick()
    view._flush(job)
    assert "[0] still building the PyTorch extension after 6" in out.getvalue()
    assert "stalled?" not in out.getvalue()


def test_a_restarted_jobs_dashboard_says_its_attempt_and_why_each_earlier_one_ended(tmp_path):
    from hvd_magics.job.views.widgets_view import WidgetView

    view = WidgetView()
    job = _job(tmp_path, 2, [view])
    job.earlier_attempts = ("rank 1 on h: killed by signal 9 <SIGKILL>",)
    job.tick()
    job.end()
    assert ", attempt 2<br>attempt 1 ended: rank 1 on h: killed by signal 9 &lt;SIGKILL&gt;" \
        in view.header.value
    first = WidgetView()
    once = _job(tmp_path, 2, [first])
    once.tick()
    once.end()
    assert "attempt" not in first.header.value


def test_a_plain_cell_of_many_ranks_prints_one_epoch_line_of_what_differs(tmp_path):
    out = io.StringIO()
    job = _job(tmp_path, 8, [TextView(stream=out, epoch_lines=True)])
    for rank in range(8):
        job.handle({"kind": "epoch_end", "rank": rank, "host": "h", "epoch": 1, "epochs": 2,
                    "duration": 1.5, "metrics": {"loss": 0.3 + 0.01 * rank}})
    job.end()
    lines = [line for line in out.getvalue().splitlines() if "epoch 1/2" in line]
    assert lines == ["[0] epoch 1/2 done in 1.50 s: loss 0.3",
                     "[7] ranks 1-7 alike: epoch 1/2 done in 1.50 s: loss 0.31 to 0.37"], lines
