"""Spark DataFrames delivered to the ranks as shards, on local Spark: every column kind, train and
validation, unequal partitions, real training, and bad input refused before training."""
import os
import re
import subprocess
import time

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, PayloadError, last_run
from tests import jobs
from tests.frames import MIXED_IDS, check_cover, digits_frames, mixed_frame, read_reports


def test_each_rank_gets_a_disjoint_shard_of_every_column_kind(local_spark, tmp_path):
    train = mixed_frame(local_spark)
    val = train.where("id % 5 = 0")
    HorovodRunner(np=2).run(jobs.shard_report, out=str(tmp_path), train=train, val=val)
    reports = read_reports(tmp_path, 2)
    counts = check_cover(reports, "train", MIXED_IDS)
    assert max(counts) - min(counts) <= 4  # one remainder row per source partition at most
    check_cover(reports, "val", [i for i in MIXED_IDS if i % 5 == 0])
    for rank, report in enumerate(reports):
        train_report = report["train"]
        assert train_report["rank"] == rank and train_report["size"] == 2
        assert train_report["dtypes"] == {"id": "int64", "arr": "list<element: float>",
                                          "name": "string", "label": "double", "vec": "vector"}
        ids = train_report["ids"]
        assert train_report["vec"]["shape"] == [len(ids), 2]
        # row 0's vector is sparse in Spark (all zeros): it arrives scattered like the rest
        assert train_report["vec"]["rows"] == [[float(i), 2.0 * i] for i in ids]
        assert train_report["arr"]["dtype"] == "float32"
        assert train_report["arr"]["rows"] == [[float(i), 2.0 * i + 1] for i in ids]
        assert train_report["name"] == [f"row{i}" for i in ids]
        assert train_report["steps"] == -(-max(counts) // 16)  # the same on every rank
        assert train_report["repr"].startswith(f"<Shard of train: rank {rank} of 2, ")
    record = last_run()
    assert [s["name"] for s in record.shards] == ["train", "val"]
    assert record.shards[0]["rows_per_rank"] == counts and record.shards[0]["bytes"] > 0
    assert re.search(r"data train +400 rows as", str(record))


def test_a_keras_model_trains_on_dataframe_shards(local_spark):
    train, val = digits_frames(local_spark)
    result = HorovodRunner(np=2).run(jobs.keras_digits, train=train, val=val)
    assert result["val_accuracy"] >= 0.9, result
    assert sum(result["rows"]) == train.count()


def test_a_cell_reads_a_notebook_dataframe(ip, local_spark, tmp_path):
    ip.user_ns["train"] = mixed_frame(local_spark)
    value = ip.run_cell_magic("horovod", "np=2 -q", "import horovod.torch as hvd\nhvd.init()\n"
                              "(len(train), train.columns, train.rows_per_rank)\n")
    rows, columns, rows_per_rank = value
    assert columns == ["id", "arr", "name", "label", "vec"] and sum(rows_per_rank) == 400
    assert rows == rows_per_rank[0]
    assert last_run().shards[0]["name"] == "train"


def test_bad_dataframes_are_refused_before_training(local_spark, tmp_path):
    tiny = local_spark.range(1)
    start = time.monotonic()
    with pytest.raises(HorovodJobError, match="the DataFrame 'train' has 1 rows, fewer than the 2 "
                                              "ranks: every rank needs at least one. Fix: use "
                                              "np<=1"):
        HorovodRunner(np=2).run(jobs.shard_report, out=str(tmp_path), train=tiny)
    assert time.monotonic() - start < 60
    assert last_run().pids == {}  # no rank process started
    maps = local_spark.range(4).selectExpr("id", "map('a', id) AS tags")
    with pytest.raises(PayloadError, match="column 'tags' of the DataFrame 'train' has type "
                                           "map<string,bigint>: .*Fix: train.drop\\('tags'\\)"):
        HorovodRunner(np=2).run(jobs.shard_report, out=str(tmp_path), train=maps)
    nested = local_spark.range(4).selectExpr("id", "array(array(id)) AS grid")
    with pytest.raises(PayloadError, match="column 'grid' .* arrays of array<bigint>"):
        HorovodRunner(np=2).run(jobs.shard_report, out=str(tmp_path), train=nested)
    with pytest.raises(PayloadError, match="np<0 runs the ranks on the driver .* Fix: use np=2"):
        HorovodRunner(np=-2).run(jobs.shard_report, out=str(tmp_path), train=tiny)
    # and the session still runs the next job
    assert HorovodRunner(np=2).run(jobs.print_lines, count=1) == 0


@pytest.fixture()
def small_disk(tmp_path):
    """A 24 MB tmpfs (the tests run as root, as CI does)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_shard_larger_than_the_free_disk_is_refused(local_spark, small_disk, tmp_path):
    from pyspark.sql import functions as F

    big = local_spark.range(0, 20_000, 1, 2).select(
        "id", F.array_repeat(F.col("id").cast("float"), 512).alias("x"))  # ~40 MB of floats
    with pytest.raises(HorovodJobError, match="the shard of 'big' does not fit on .*small-disk.* "
                                              "MB free. Fix: more ranks"):
        HorovodRunner(np=2, env={"HVD_MAGICS_SHARD_DIR": str(small_disk)}).run(
            jobs.shard_report, out=str(tmp_path), big=big)
    assert os.listdir(small_disk) == []  # what was written is gone


def test_partition_keys_land_where_spark_sends_them(local_spark):
    from pyspark.sql import functions as F

    from hvd_magics.launch.dataframe_input import partition_keys, spark_hash_int

    values = [0, 1, -7, 123456, 2**31 - 1]
    hashed = local_spark.createDataFrame([(v,) for v in values], "v int").select(
        F.hash("v").alias("h")).collect()
    assert [row.h for row in hashed] == [spark_hash_int(v) for v in values]
    keys = partition_keys(5)
    placed = (local_spark.createDataFrame([(k,) for k in keys], "key int").repartition(5, "key")
              .select("key", F.spark_partition_id().alias("p")).collect())
    assert {row.key: row.p for row in placed} == {k: p for p, k in enumerate(keys)}
