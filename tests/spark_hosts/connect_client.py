"""A Spark Connect client whose server's executors are real hosts (run by
tests/spark_hosts/test_connect_hosts.py in a process of its own: a Connect server runs a
SparkContext in the process that starts it, which cannot live beside the tier's classic one).

``python -m tests.spark_hosts.connect_client MASTER_URL CONF_JSON``: starts a local Connect server
on that standalone master (``spark.api.mode=connect``) with the hosts' session settings, runs a
Horovod and a torch job of 4 ranks and a DataFrame dealt to them, and prints one JSON line after
``@@result``.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

ROOT = str(pathlib.Path(__file__).parents[2])
sys.path.insert(0, ROOT)

import cloudpickle  # noqa: E402

from tests import engine_jobs, jobs  # noqa: E402

cloudpickle.register_pickle_by_value(engine_jobs)
cloudpickle.register_pickle_by_value(jobs)


def main() -> None:
    from pyspark.sql import SparkSession

    from hvd_magics import HorovodRunner, last_run

    url, conf = sys.argv[1], json.loads(sys.argv[2])
    builder = SparkSession.builder.master(url).config("spark.api.mode", "connect")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    found: dict = {"connect": type(spark).__module__}
    for engine in ("horovod", "torch"):
        began = time.monotonic()
        views = HorovodRunner(np=4, engine=engine, timeout=180).run(engine_jobs.hosts_of_ranks,
                                                                    engine=engine)
        found[engine] = {"views": views, "where": last_run().where,
                         "hosts": sorted(set(last_run().hosts.values())),
                         "seconds": round(time.monotonic() - began, 1)}
    frame = spark.range(0, 400).selectExpr("cast(id as double) as x")
    found["shard"] = HorovodRunner(np=4, engine="torch", timeout=180).run(jobs.shard_sums,
                                                                           df=frame)["df"]
    print("@@result " + json.dumps(found), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
