"""DataFrames the tests train on (built with either a classic or a Spark Connect session)."""
from __future__ import annotations

import json
from pathlib import Path

#: ``mixed_frame`` rows: ids 0-99 and 900-1199, in four partitions of 100, 0, 0 and 300 rows.
MIXED_IDS = list(range(100)) + list(range(900, 1200))


def mixed_frame(spark):
    """Numeric, vector (dense, and sparse where VectorAssembler makes it so), array and string
    columns, over unequal partitions (two of them empty)."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import functions as F

    df = (spark.range(0, 1200, 1, 4).where("id < 100 or id >= 900")
          .withColumn("a", F.col("id").cast("double"))
          .withColumn("b", (F.col("id") * 2).cast("double"))
          .withColumn("arr", F.array(F.col("a"), F.col("b") + 1).cast("array<float>"))
          .withColumn("name", F.concat(F.lit("row"), F.col("id").cast("string")))
          .withColumn("label", (F.col("id") % 10).cast("double")))
    return VectorAssembler(inputCols=["a", "b"], outputCol="vec").transform(df).drop("a", "b")


def digits_frames(spark):
    """scikit-learn's 8x8 digits as ``pixels`` (array<float>, 64) and ``label`` (int):
    ``(train, validation)``, split 80/20 by a fixed seed."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = [((digits.data[i] / 16.0).astype(np.float32).tolist(), int(digits.target[i]))
            for i in range(len(digits.target))]
    df = spark.createDataFrame(rows, "pixels array<float>, label int").repartition(3)
    return df.randomSplit([0.8, 0.2], seed=7)


def read_reports(folder: str | Path, size: int) -> list[dict]:
    """What each rank of ``tests.jobs.shard_report`` wrote, in rank order."""
    return [json.loads((Path(folder) / f"{rank}.json").read_text()) for rank in range(size)]


def check_cover(reports: list[dict], name: str, ids: list[int]) -> list[int]:
    """Assert the ranks' shards of ``name`` are disjoint and hold every id once; return the
    rows per rank."""
    seen = [r[name]["ids"] for r in reports]
    assert sorted(sum(seen, [])) == sorted(ids), "shards must hold every row exactly once"
    counts = [len(s) for s in seen]
    assert all(r[name]["rows_per_rank"] == counts for r in reports)
    return counts
