"""Events kept in a task when the executors cannot reach the notebook, and how the driver gets
them back; a task that cannot reach the notebook says what to set."""
import socket

import pytest

from hvd_magics.channel import ChannelAddress
from hvd_magics.launch.spark_backend import replay_order
from hvd_magics.launch.spark_session import no_live_view_reason
from hvd_magics.protocol import EXIT, OUTPUT, PROGRESS, RESULT
from hvd_magics.task import event_buffer
from hvd_magics.task.event_buffer import EventBuffer, replay
from hvd_magics.task.spark_task import DriverUnreachable, TaskSpec, _connect, RankHolder


def _lines(events):
    return [line for e in events if e["kind"] == OUTPUT for line in e["lines"]]


def test_the_buffer_keeps_the_head_and_tail_of_the_output_and_every_other_event(monkeypatch):
    monkeypatch.setattr(event_buffer, "KEPT_LINES", 4)
    monkeypatch.setattr(event_buffer, "CHUNK_CHARS", 100)
    buffer = EventBuffer(rank=1, host="h", job_id="j")
    for i in range(12):
        buffer.send({"kind": OUTPUT, "lines": [f"line {i}"]})
        buffer.send({"kind": PROGRESS, "step": i})  # live only: not kept
    buffer.send({"kind": RESULT, "parts": None})
    buffer.send({"kind": EXIT, "code": 0})
    chunks = list(buffer.chunks())
    assert len(chunks) > 1 and all(len(c) <= 100 for c in chunks)
    events = replay(chunks)
    assert _lines(events) == ["line 0", "line 1", "line 2", "line 3",
                              "[hvd_magics: 4 lines of output left out here]",
                              "line 8", "line 9", "line 10", "line 11"]
    assert [e["kind"] for e in events][-2:] == [RESULT, EXIT]
    assert all(e["rank"] == 1 and e["host"] == "h" and e["job"] == "j" for e in events)
    assert PROGRESS not in {e["kind"] for e in events}


def test_replayed_events_keep_each_tasks_order_and_get_driver_times():
    first = [{"kind": OUTPUT, "rank": 0, "time": 10.0}, {"kind": EXIT, "rank": 0, "time": 12.0}]
    second = [{"kind": OUTPUT, "rank": 1, "time": 11.0}, {"kind": EXIT, "rank": 1, "time": 11.5}]
    merged = replay_order({0: first, 1: second})
    assert [(e["rank"], e["time"]) for e in merged] == [(0, 10.0), (1, 11.0), (1, 11.5), (0, 12.0)]
    recv = [e["recv"] for e in merged]
    assert recv == sorted(recv) and recv[-1] - recv[0] == pytest.approx(2.0)


def test_a_task_that_cannot_reach_the_notebook_says_what_to_set():
    with socket.socket() as closed:  # a port nobody listens on: the connection is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    spec = TaskSpec(b"", ChannelAddress("127.0.0.1", port, b"s" * 32, "job"))
    with pytest.raises(DriverUnreachable, match=f"cannot reach the notebook's event channel at "
                                                f"127.0.0.1:{port} \\(ConnectionRefusedError"):
        _connect(spec, 0, "127.0.0.1", RankHolder())
    assert isinstance(_connect(TaskSpec(b"", None), 0, "h", RankHolder()), EventBuffer)


def test_the_live_view_is_off_when_asked(monkeypatch):
    class Classic:  # a session whose module is not Spark Connect's
        pass

    monkeypatch.setenv("HVD_MAGICS_LIVE", "0")
    assert no_live_view_reason(Classic()) == "HVD_MAGICS_LIVE=0 is set"
    monkeypatch.setenv("HVD_MAGICS_LIVE", "1")
    assert no_live_view_reason(Classic()) is None


def test_a_remote_connect_server_means_no_live_view(monkeypatch):
    """The decision only (a real remote Connect server needs a second machine)."""
    class Client:
        host = "connect.example.invalid"

    class RemoteSession:
        __module__ = "pyspark.sql.connect.session"
        _client = Client()

    monkeypatch.delenv("HVD_MAGICS_LIVE", raising=False)
    monkeypatch.delenv("HVD_MAGICS_DRIVER_HOST", raising=False)
    assert "the Spark Connect server connect.example.invalid runs the executors" in \
        no_live_view_reason(RemoteSession())
    Client.host = "localhost"
    assert no_live_view_reason(RemoteSession()) is None
    Client.host = "connect.example.invalid"
    monkeypatch.setenv("HVD_MAGICS_DRIVER_HOST", "10.1.2.3")  # the user says where we are
    assert no_live_view_reason(RemoteSession()) is None
