"""Executors whose Python has the frameworks but not hvd_magics: the package travels with the job
(issue 39). The cluster's executors run the Python the session names (pyspark sends the driver's
``sc.pythonExec`` with every Python function), here a virtual environment made by the test whose
site-packages reach this one's frameworks through a ``.pth`` line, which does not run the
editable install's own ``.pth`` (so ``import hvd_magics`` fails there)."""
import re
from pathlib import Path

import pytest

from hvd_magics import HorovodRunner
from hvd_magics.launch import package_shipping, spark_session
from hvd_magics.launch.spark_session import local_workers_use_this_python
from tests import engine_jobs
from tests.environments import frameworks_only_python, small_environment


@pytest.fixture(scope="module")
def python_without_hvd_magics(tmp_path_factory):
    return frameworks_only_python(tmp_path_factory.mktemp("frameworks-only"))


def test_every_engine_runs_on_executors_without_hvd_magics(cluster_spark,
                                                          python_without_hvd_magics):
    sc = cluster_spark.sparkContext
    spark_session._SENT.clear()  # as a fresh kernel: nothing sent to this application yet
    with local_workers_use_this_python(sc, python_without_hvd_magics):
        ddp = HorovodRunner(np=2, engine="torch").run(engine_jobs.ddp_where)
        sent = set(spark_session._SENT)
        horovod = HorovodRunner(np=2).run(engine_jobs.horovod_where)
        tf = HorovodRunner(np=2, engine="tf").run(engine_jobs.tf_where)
    zip_name = package_shipping.package_zip().name
    assert [Path(path).name for _, path in sent] == [zip_name]  # sent once to this application,
    assert spark_session._SENT == sent  # then not again
    for executable, package, total, *rest in (ddp, horovod, tf):
        assert executable == python_without_hvd_magics  # the rank's own Python
        assert f"{zip_name}/hvd_magics/__init__.py" in package  # the driver's, from the zip
        assert total == 2.0 and rest in ([], [2])


def test_the_notebooks_environment_travels_once_and_again_after_an_install(
        cluster_spark, tmp_path, capfd):
    from hvd_magics import ship_environment
    env = small_environment(tmp_path / "notebook-env", "1.0")
    spark_session._SENT.difference_update(  # no environment sent to this application yet
        [sent for sent in spark_session._SENT if "#hvd_env_" in sent[1]])
    choice = ship_environment(env)
    assert "packed " in capfd.readouterr().err
    try:
        first = HorovodRunner(np=2).run(engine_jobs.shipped_marker_where)
        said = capfd.readouterr().err
        second = HorovodRunner(np=2).run(engine_jobs.shipped_marker_where)
        again = capfd.readouterr().err
        small_environment(env, "2.0")  # as `%pip install shipped_marker==2.0` would
        third = HorovodRunner(np=2).run(engine_jobs.shipped_marker_where)
        changed = capfd.readouterr().err
    finally:
        ship_environment(False)
    executable, prefix, version = first
    # the rank ran the unpacked archive's interpreter, in the executor's own folders
    assert re.search(r"/hvd_env_[0-9a-f]{16}/bin/python$", executable), executable
    assert not executable.startswith(str(env)), executable
    assert third[0].endswith(f"/{choice.shipped.alias}/bin/python") and third[0] != executable
    assert version == "1.0" and "hvd_env_" in prefix
    assert "sent the environment to the executors" in said
    assert second[2] == "1.0" and "sent the environment" not in again  # sent once
    assert third[2] == "2.0" and "the environment changed since it was last shipped" in changed
    assert "sent the environment to the executors" in changed


def test_executors_with_only_arrow_run_every_engine_in_the_shipped_environment(
        cluster_spark, tmp_path, capfd):
    """What issue 39 is for: executors whose Python has what Spark's Arrow tasks need and no
    framework, no Horovod, no hvd_magics; the notebook ships its environment and every engine
    runs there (the task plans its ranks and serves Horovod's rendezvous without Horovod)."""
    from hvd_magics import ship_environment
    from tests.environments import arrow_only_python, reach_frameworks

    bare = arrow_only_python(tmp_path / "executors")
    env = reach_frameworks(small_environment(tmp_path / "notebook-env", "1.0"))
    spark_session._SENT.difference_update(
        [sent for sent in spark_session._SENT if "#hvd_env_" in sent[1]])
    with local_workers_use_this_python(cluster_spark.sparkContext, bare):
        ship_environment(env)
        try:
            results = [HorovodRunner(np=2, engine=engine).run(job) for engine, job in (
                ("torch", engine_jobs.ddp_where), ("horovod", engine_jobs.horovod_where),
                ("tf", engine_jobs.tf_where))]
            # the estimator: its fit's ranks and its transform's UDF run in the shipped Python
            predicted = _fit_and_transform(cluster_spark)
            kinds = _every_kind_of_job(cluster_spark)
        finally:
            ship_environment(False)
    for executable, package, total, *rest in results:
        assert re.search(r"/hvd_env_[0-9a-f]{16}/bin/python$", executable), executable
        assert total == 2.0 and rest in ([], [2])
    assert len(predicted) == 64 and set(predicted) <= {0.0, 1.0}
    for kind, (executable, version) in kinds.items():
        assert re.search(r"/hvd_env_[0-9a-f]{16}/bin/python$", executable), (kind, executable)
        assert version == "1.0", kind


def _every_kind_of_job(spark) -> dict:
    """A warm pool's cell, a background job, an elastic job and a job reading DataFrame shards:
    each rank's Python and the shipped package's version."""
    from hvd_magics import HorovodPool

    def where(result):
        return result[0], result[2]

    found = {}
    with HorovodPool(np=2) as pool:
        found["pool"] = where(pool.run(engine_jobs.shipped_marker_where))
    found["background"] = where(HorovodRunner(np=2).start(engine_jobs.shipped_marker_where).wait())
    found["elastic"] = where(HorovodRunner(np="1:2").run(engine_jobs.shipped_marker_where))
    frame = spark.range(100).selectExpr("cast(id as double) as x").repartition(2)
    found["shards"] = where(HorovodRunner(np=2).run(engine_jobs.shipped_marker_where_with,
                                                    numbers=frame))
    return found


def _fit_and_transform(spark) -> list[float]:
    """A small torch classifier fitted on 64 rows by 2 ranks; its predictions of those rows."""
    from hvd_magics import HorovodEstimator
    from tests.estimator_models import torch_mlp

    rows = [([float(i % 2), float(i % 3), 1.0, float(i) / 64], i % 2) for i in range(64)]
    frame = spark.createDataFrame(rows, "features array<float>, label int").repartition(2)
    model = HorovodEstimator(model=torch_mlp(inputs=4, classes=2), loss="cross_entropy",
                             featuresCol="features", np=2, epochs=1, batchSize=8).fit(frame)
    return [row.prediction for row in model.transform(frame).select("prediction").collect()]
