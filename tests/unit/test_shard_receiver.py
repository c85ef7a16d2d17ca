"""A warm pool's shard receiver and the dealer's stream, over real sockets on loopback."""
import secrets

import pyarrow as pa
import pytest

from hvd_magics.rank.api.shard import Shard
from hvd_magics.task.shard_receiver import ShardReceiver, send_rows

SECRET = secrets.token_bytes(32)


def _tagged(ids: list[int], source: int = 0) -> pa.RecordBatch:
    """Rows as the dealing stage gets them: ``(__source, __key, __s0 = struct(id, x))``."""
    rows = pa.StructArray.from_arrays([pa.array(ids, pa.int64()),
                                       pa.array([i * 0.5 for i in ids], pa.float64())],
                                      names=["id", "x"])
    return pa.RecordBatch.from_arrays([pa.array([source] * len(ids), pa.int32()),
                                       pa.array([0] * len(ids), pa.int32()), rows],
                                      names=["__source", "__key", "__s0"])


@pytest.fixture
def receiver(tmp_path):
    found = ShardReceiver(tmp_path / "task", SECRET)
    yield found
    found.close()


def test_streamed_rows_become_the_ranks_shard_file(receiver):
    shards = send_rows(("127.0.0.1", receiver.port), SECRET, "deal1", {0: "train"},
                       [_tagged([1, 2, 3]), _tagged([4, 5])])
    assert [(s["source"], s["rows"]) for s in shards] == [(0, 5)]
    shard = Shard(shards[0]["path"], "train")
    assert shard.to_numpy("id").tolist() == [1, 2, 3, 4, 5]
    assert shard.to_numpy("x").tolist() == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert shards[0]["path"].startswith(str(receiver.folder / "deal1"))


def test_a_partition_without_rows_is_said_and_writes_nothing(receiver):
    shards = send_rows(("127.0.0.1", receiver.port), SECRET, "deal2", {0: "train", 1: "val"},
                       iter([]))
    assert [(s["source"], s["rows"]) for s in shards] == [(0, 0), (1, 0)]
    assert not any((receiver.folder / "deal2").iterdir())


def test_a_dealer_without_the_secret_is_turned_away_and_nothing_is_written(receiver):
    with pytest.raises(ConnectionError):
        send_rows(("127.0.0.1", receiver.port), b"x" * 32, "deal3", {0: "train"},
                  [_tagged([1])])
    assert not (receiver.folder / "deal3").exists()


def test_a_deal_is_dropped_and_closing_removes_every_shard(receiver):
    send_rows(("127.0.0.1", receiver.port), SECRET, "deal4", {0: "train"}, [_tagged([1])])
    send_rows(("127.0.0.1", receiver.port), SECRET, "deal5", {0: "train"}, [_tagged([2])])
    receiver.drop("deal4")
    assert sorted(p.name for p in receiver.folder.iterdir()) == ["deal5"]
    with pytest.raises(ValueError, match="bad deal id"):
        receiver.drop("../elsewhere")
    receiver.close()
    assert not receiver.folder.exists()
