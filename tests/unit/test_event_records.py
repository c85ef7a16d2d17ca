"""Every event kind has its typed record (hvd_magics.events), and building one sends what the
wire carried before the records: the same keys, in the same order."""
import dataclasses
import json
import os
import typing

from hvd_magics import events
from hvd_magics.channel import stamp
from hvd_magics.events import Event, Frame, Order, RankEvent, StartedEvent, StepSplitEvent
from hvd_magics.protocol import EVENTS, STARTED, STEP_SPLIT, is_event, is_order
from hvd_magics.task.shard_files import ShardFile


def test_each_kind_names_its_record_and_the_record_its_kind():
    for name, kind in EVENTS.items():
        literal = typing.get_type_hints(kind.record, vars(events))["kind"]
        assert typing.get_args(literal) == (name,), name
        assert kind.meaning, f"{kind.record.__name__} says nothing of what it means"
    unions = [set(typing.get_args(union)) for union in (Event, Order, Frame)]
    for kind in EVENTS.values():  # each record travels one way
        assert sum(kind.record in union for union in unions) == 1, kind.name
    assert set(typing.get_args(RankEvent)) <= unions[0]


def test_a_record_off_the_wire_is_told_by_its_kind():
    assert is_event({"kind": STARTED, "pid": 1}) and not is_order({"kind": STARTED})
    assert is_order({"kind": "take_stacks", "request": "r"})
    assert not is_event({"kind": "take_stacks"}) and not is_event({"kind": "hello"})
    assert not is_event({"pid": 1}) and not is_event({"kind": "no such kind"})


def test_a_rank_writes_its_kind_its_clock_then_its_fields(monkeypatch):
    from hvd_magics.rank import rank_events

    read, write = os.pipe()
    monkeypatch.setattr(rank_events, "_stream", os.fdopen(write, "wb", buffering=0))
    monkeypatch.setattr(rank_events, "_opened", True)
    event = StepSplitEvent(kind=STEP_SPLIT, rows=[[1, 0.5]], totals=[1, 0.5], dropped=0,
                           gpu=None, memory={"rss": 1, "peak": 2}, clock="host", pace=[])
    event["cpu_read"] = False
    rank_events.emit(event)
    rank_events.close()
    with os.fdopen(read, "rb") as stream:
        sent = json.loads(stream.readline())
    assert list(sent) == ["kind", "rtime", "rows", "totals", "dropped", "gpu", "memory",
                          "clock", "pace", "cpu_read"]
    assert sent["kind"] == STEP_SPLIT and sent["cpu_read"] is False


def test_a_supervisor_stamps_who_where_and_when_before_the_fields():
    stamped = stamp(StartedEvent(kind=STARTED, pid=7), 3, "h", "job")
    assert list(stamped) == ["kind", "rank", "host", "time", "job", "pid"]
    assert (stamped["kind"], stamped["rank"], stamped["pid"]) == (STARTED, 3, 7)


def test_a_shard_travels_with_every_field_of_its_file():
    shard = ShardFile(2, "/tmp/s.arrow", rows=5, bytes=10, nulls={"x": 1})
    assert shard.as_dict() == dataclasses.asdict(shard)
    assert list(shard.as_dict()) == [f.name for f in dataclasses.fields(ShardFile)]
