"""A Spark Connect client process that runs the tests' scenarios one at a time, on one session.

A Connect server runs a SparkContext in the process that starts it, which cannot live beside the
other tests' classic session; starting one costs half a minute. So one worker process holds one
Connect session (``remote("local[2]")``) for the module, and each test asks it for one scenario:
a line ``NAME OUT_DIR`` on stdin; the answer is one JSON line after ``@@result``: what the
scenario printed (``out``, ``err``) and its traceback when it raised (``error``).
"""
from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import pathlib
import signal
import sys
import threading
import time
import traceback

ROOT = str(pathlib.Path(__file__).parents[2])
sys.path.insert(0, ROOT)

import cloudpickle  # noqa: E402

from tests import engine_jobs, estimator_models, jobs  # noqa: E402

cloudpickle.register_pickle_by_value(jobs)
cloudpickle.register_pickle_by_value(engine_jobs)
cloudpickle.register_pickle_by_value(estimator_models)

from hvd_magics import (HorovodJobError, HorovodMagicsError, HorovodRunner,  # noqa: E402
                        JobInterrupted, NotEnoughSlotsError, last_run)
from tests.frames import MIXED_IDS, check_cover, digits_frames, mixed_frame, read_reports  # noqa: E402


def allreduce(spark, out):
    result = HorovodRunner(np=2).run(jobs.torch_allreduce)
    print("sums", [r["sum"] for r in result], "where", last_run().where)


def a_failing_rank_then_a_clean_job(spark, out):
    try:
        HorovodRunner(np=2).run(jobs.fail_on_rank, bad_rank=1, how="raise")
    except HorovodJobError as exc:
        print("error", exc.failures[0].headline())
    print("again", HorovodRunner(np=2).run(jobs.print_lines, count=1))


def an_interrupt(spark, out):
    pid_file = f"{out}/child"

    def interrupt_when_running():
        while not all(os.path.exists(f"{pid_file}.{r}") for r in (0, 1)):
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    try:
        HorovodRunner(np=2).run(jobs.start_children_and_wait, pid_file=pid_file)
    except JobInterrupted as exc:
        print("interrupted", exc)
    children = [int(open(f"{pid_file}.{r}").read()) for r in (0, 1)]
    print("children left", [c for c in children if os.path.exists(f"/proc/{c}")
                            and open(f"/proc/{c}/stat").read().split()[2] != "Z"])
    print("after", HorovodRunner(np=2).run(jobs.print_lines, count=1))


def shards(spark, out):
    HorovodRunner(np=2).run(jobs.shard_report, out=out, train=mixed_frame(spark))
    counts = check_cover(read_reports(out, 2), "train", MIXED_IDS)
    print("shards", sum(counts), max(counts) - min(counts) <= 4, last_run().shards[0]["name"])


def torch_on_dataframes(spark, out):
    train, val = digits_frames(spark)
    result = HorovodRunner(np=2).run(jobs.torch_digits, train=train, val=val)
    print("torch accuracy", result["accuracy"] >= 0.9, result)


def ddp_on_dataframes(spark, out):
    frame = spark.range(0, 640).selectExpr(
        "array(cast(id % 7 as float), 1.0f, 0.0f, 0.5f, 0.25f, 2.0f, 3.0f, "
        "cast(id % 3 as float)) as x", "cast(id % 7 + id % 3 as float) as y")
    result = HorovodRunner(np=2, engine="torch").run(engine_jobs.ddp_mlp, epochs=1, batch=32,
                                                      shard=frame)
    views = HorovodRunner(np=2, engine="torch").run(engine_jobs.ddp_allreduce)
    print("ddp", len(set(result["checksums"])), [v["sum"] for v in views], last_run().engine,
          last_run().where)


def estimator(spark, out):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    from hvd_magics.estimator import HorovodEstimator, HorovodModel

    train, val = digits_frames(spark)
    fitted = HorovodEstimator(model=estimator_models.torch_mlp(), loss="cross_entropy",
                              learningRate=0.003, epochs=2, np=2, featuresCol="pixels",
                              modelDir=f"{out}/estimator").fit(train)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(
        fitted.transform(val))
    fitted.write().overwrite().save(f"{out}/saved")
    reloaded = HorovodModel.load(f"{out}/saved").transform(val)
    print("estimator", fitted.framework, len(fitted.history), accuracy >= 0.85,
          reloaded.count() == val.count())


def tls_refused(spark, out):
    """A session that asks for TLS, read through the Connect session: refused, as pyspark's own
    distributor refuses it, until pyspark's setting allows it."""
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorchDistributor

    from hvd_magics.errors import EncryptionRequired

    spark.conf.set("spark.ssl.enabled", "true")
    before = last_run()  # (an earlier function of this worker may have run a job)
    try:
        try:
            HorovodRunner(np=2).run(jobs.print_lines, count=1)
        except EncryptionRequired as exc:
            print("refused", exc, "ran", last_run() is not before)
        try:
            PysparkTorchDistributor(1, True, False)._check_encryption()
        except RuntimeError as exc:
            print("pyspark refused too:", "encryption in transit" in str(exc))
        spark.conf.set("pytorch.spark.distributor.ignoreSsl", "true")
        print("allowed", HorovodRunner(np=2).run(jobs.print_lines, count=1))
    finally:
        spark.conf.unset("spark.ssl.enabled")
        spark.conf.unset("pytorch.spark.distributor.ignoreSsl")


def too_many_ranks(spark, out):
    try:
        HorovodRunner(np=3).run(jobs.print_lines, count=1)
    except NotEnoughSlotsError as exc:
        print("slots", exc)


def elastic_loses_a_task(spark, out):
    marks = pathlib.Path(out) / "elastic"
    marks.mkdir()
    (marks / "hold").touch()

    def kill_task_1():
        while not glob.glob(f"{marks}/*-task1-*.pid"):
            time.sleep(0.05)
        os.kill(int(open(glob.glob(f"{marks}/*-task1-*.pid")[0]).read()), signal.SIGKILL)
        while not (marks / "size1").exists():
            time.sleep(0.05)
        (marks / "hold").unlink()

    threading.Thread(target=kill_task_1, daemon=True).start()
    result = HorovodRunner(np="1:2").run(jobs.elastic_torch, steps=40, marks=str(marks))
    print("elastic", [(r["size"], r["step"]) for r in result],
          [(r["size"], r["causes"]) for r in last_run().resets])


def warm_pool(spark, out):
    from hvd_magics import HorovodPool

    with HorovodPool(np=2) as pool:
        first = pool.run(jobs.pool_build_model)
        trained = pool.run(jobs.pool_train_kept, steps=3)
        pid = pool.run(jobs.pool_read, name="model")[1]
        print("pool", last_run().where, trained != first,
              pool.run(jobs.pool_read, name="model")[1] == pid)
        try:
            pool.run(jobs.pool_raise_on_rank_1_while_0_allreduces)
        except HorovodJobError as exc:
            print("pool stuck", "The ranks were restarted" in str(exc))
        print("pool after", pool.run(jobs.pool_read, name="model")[0])
    print("cold after the pool", HorovodRunner(np=2).run(jobs.print_lines, count=1))


def pool_dataframe(spark, out):
    from hvd_magics import HorovodPool, PayloadError

    frame = mixed_frame(spark)
    with HorovodPool(np=2) as pool:  # local[2]: no slot is left to deal a DataFrame
        try:
            pool.run(jobs.shard_report, out=out, train=frame)
        except PayloadError as exc:
            print("pool full", exc)
    with HorovodPool(np=1) as pool:
        pool.run(jobs.shard_report, out=out, train=frame)
        print("pool shards", sum(check_cover(read_reports(out, 1), "train", MIXED_IDS)))
        again = pool.run(jobs.shard_report, out=out, train=frame)
        print("pool reused", sorted(again["train"]["ids"]) == MIXED_IDS)


@contextlib.contextmanager
def _not_live():
    """Executors that cannot reach the notebook: everything comes back with the Spark result."""
    os.environ["HVD_MAGICS_LIVE"] = "0"
    try:
        yield
    finally:
        del os.environ["HVD_MAGICS_LIVE"]


def quiet_value(spark, out):
    with _not_live():
        print("quiet value", HorovodRunner(np=2).run(jobs.print_lines, count=3))


def quiet_error(spark, out):
    with _not_live():
        try:
            HorovodRunner(np=2).run(jobs.fail_on_rank, bad_rank=1, how="raise")
        except HorovodJobError as exc:
            print("quiet error", exc.failures[0].headline())


def quiet_shards(spark, out):
    with _not_live():
        HorovodRunner(np=2).run(jobs.shard_report, out=out, train=mixed_frame(spark))
        print("quiet shards", sum(check_cover(read_reports(out, 2), "train", MIXED_IDS)))


def quiet_pool(spark, out):
    from hvd_magics import HorovodPool

    with _not_live():
        try:
            HorovodPool(np=2)
        except HorovodMagicsError as exc:
            print("quiet pool", exc)


def quiet_elastic(spark, out):
    with _not_live():
        try:
            HorovodRunner(np="1:2").run(jobs.print_lines, count=1)
        except HorovodMagicsError as exc:
            print("quiet elastic", exc)


def shipped_environment(spark, out):
    from hvd_magics import ship_environment
    from tests.environments import small_environment

    env = small_environment(pathlib.Path(out) / "notebook-env", "1.0")
    ship_environment(env)
    try:
        first = HorovodRunner(np=2).run(engine_jobs.shipped_marker_where)
        second = HorovodRunner(np=2).run(engine_jobs.shipped_marker_where)
    finally:
        ship_environment(False)
    print("shipped", first[2], second[2], first[0].startswith(str(env)),
          "/hvd_env_" in first[0])


def shipped_to_bare_workers(spark, out):
    """Workers whose Python has pyarrow and numpy only: every engine runs in the shipped
    environment (a small venv that reaches this one's frameworks)."""
    from hvd_magics import ship_environment
    from tests.environments import reach_frameworks, small_environment

    env = reach_frameworks(small_environment(pathlib.Path(out) / "notebook-env", "1.0"))
    ship_environment(env)
    try:
        for engine, job in (("torch", engine_jobs.ddp_where),
                            ("horovod", engine_jobs.horovod_where),
                            ("tf", engine_jobs.tf_where)):
            executable, package, total, *_ = HorovodRunner(np=2, engine=engine).run(job)
            print("shipped", engine, "/hvd_env_" in executable, ".zip/hvd_magics/" in package,
                  total)
    finally:
        ship_environment(False)


def package_travels(spark, out):
    executable, package, total = HorovodRunner(np=2, engine="torch").run(engine_jobs.ddp_where)
    print("ranks run", executable, "with hvd_magics from", package, "sum", total)


def serve() -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    answer = sys.stdout
    print("@@ready", flush=True)
    for line in sys.stdin:
        name, out_dir = line.split()
        out, err = io.StringIO(), io.StringIO()
        error = None
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                globals()[name](spark, out_dir)
            except BaseException:  # noqa: BLE001 - the test shows it
                error = traceback.format_exc()
        answer.write("@@result " + json.dumps({"out": out.getvalue(), "err": err.getvalue(),
                                               "error": error}) + "\n")
        answer.flush()
    spark.stop()


if __name__ == "__main__":
    serve()
