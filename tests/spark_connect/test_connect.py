"""A local Spark Connect session (pyspark starts the Connect server): no SparkContext, no RDDs.

Run in a subprocess: a Connect server runs a SparkContext of its own in the process that starts
it, which cannot live beside the other tests' classic session.
"""
import os
import subprocess
import sys
import re
import textwrap

from tests.conftest import ROOT

CONNECT_SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    import cloudpickle
    from tests import jobs
    cloudpickle.register_pickle_by_value(jobs)
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    from hvd_magics import HorovodJobError, HorovodRunner, last_run
    result = HorovodRunner(np=2).run(jobs.torch_allreduce)
    print("sums", [r["sum"] for r in result], "where", last_run().where)
    try:
        HorovodRunner(np=2).run(jobs.fail_on_rank, bad_rank=1, how="raise")
    except HorovodJobError as exc:
        print("error", exc.failures[0].headline())
    print("again", HorovodRunner(np=2).run(jobs.print_lines, count=1))
    import os, signal, threading, time
    from hvd_magics import JobInterrupted
    pid_file = {pid_file!r}
    def interrupt_when_running():
        while not all(os.path.exists(f"{{pid_file}}.{{r}}") for r in (0, 1)):
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt_when_running, daemon=True).start()
    try:
        HorovodRunner(np=2).run(jobs.start_children_and_wait, pid_file=pid_file)
    except JobInterrupted as exc:
        print("interrupted", exc)
    children = [int(open(f"{{pid_file}}.{{r}}").read()) for r in (0, 1)]
    print("children left", [c for c in children if os.path.exists(f"/proc/{{c}}")
                            and open(f"/proc/{{c}}/stat").read().split()[2] != "Z"])
    print("after", HorovodRunner(np=2).run(jobs.print_lines, count=1))
    from tests.frames import MIXED_IDS, check_cover, digits_frames, mixed_frame, read_reports
    HorovodRunner(np=2).run(jobs.shard_report, out={out!r}, train=mixed_frame(spark))
    counts = check_cover(read_reports({out!r}, 2), "train", MIXED_IDS)
    print("shards", sum(counts), max(counts) - min(counts) <= 4, last_run().shards[0]["name"])
    train, val = digits_frames(spark)
    result = HorovodRunner(np=2).run(jobs.torch_digits, train=train, val=val)
    print("torch accuracy", result["accuracy"] >= 0.9, result)
    from tests import estimator_models
    cloudpickle.register_pickle_by_value(estimator_models)
    from hvd_magics.estimator import HorovodEstimator, HorovodModel
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    fitted = HorovodEstimator(model=estimator_models.torch_mlp(), loss="cross_entropy",
                              learningRate=0.003, epochs=2, np=2, featuresCol="pixels",
                              modelDir={out!r} + "/estimator").fit(train)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(
        fitted.transform(val))
    fitted.write().overwrite().save({out!r} + "/saved")
    reloaded = HorovodModel.load({out!r} + "/saved").transform(val)
    print("estimator", fitted.framework, len(fitted.history), accuracy >= 0.85,
          reloaded.count() == val.count())
    from hvd_magics import NotEnoughSlotsError
    try:
        HorovodRunner(np=3).run(jobs.print_lines, count=1)
    except NotEnoughSlotsError as exc:
        print("slots", exc)
    import glob, pathlib
    marks = pathlib.Path({out!r}) / "elastic"
    marks.mkdir()
    (marks / "hold").touch()
    def kill_task_1():
        while not glob.glob(f"{{marks}}/*-task1-*.pid"):
            time.sleep(0.05)
        os.kill(int(open(glob.glob(f"{{marks}}/*-task1-*.pid")[0]).read()), signal.SIGKILL)
        while not (marks / "size1").exists():
            time.sleep(0.05)
        (marks / "hold").unlink()
    threading.Thread(target=kill_task_1, daemon=True).start()
    result = HorovodRunner(np="1:2").run(jobs.elastic_torch, steps=40, marks=str(marks))
    print("elastic", [(r["size"], r["step"]) for r in result],
          [(r["size"], r["causes"]) for r in last_run().resets])
    # executors that cannot reach the notebook: everything comes back with the Spark result
    os.environ["HVD_MAGICS_LIVE"] = "0"
    from hvd_magics import HorovodMagicsError
    try:
        HorovodRunner(np="1:2").run(jobs.print_lines, count=1)
    except HorovodMagicsError as exc:
        print("quiet elastic", exc)
    print("quiet value", HorovodRunner(np=2).run(jobs.print_lines, count=3))
    try:
        HorovodRunner(np=2).run(jobs.fail_on_rank, bad_rank=1, how="raise")
    except HorovodJobError as exc:
        print("quiet error", exc.failures[0].headline())
    HorovodRunner(np=2).run(jobs.shard_report, out={out!r}, train=mixed_frame(spark))
    print("quiet shards", sum(check_cover(read_reports({out!r}, 2), "train", MIXED_IDS)))
    spark.stop()
''')


def test_jobs_run_on_a_spark_connect_session(tmp_path):
    # A Connect server's Python workers use PYSPARK_PYTHON as the server saw it at start
    # (spark.pyspark.python cannot be changed on a running Connect session).
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "-c", CONNECT_SCRIPT.format(
        root=str(ROOT), pid_file=str(tmp_path / "child"), out=str(tmp_path))], env=env,
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sums [3.0, 3.0] where spark local[2] (Connect)" in proc.stdout, proc.stdout
    assert "error rank 1 on" in proc.stdout and "ValueError: boom from rank 1" in proc.stdout
    assert "again 0" in proc.stdout
    assert "estimator torch 2 True True" in proc.stdout, proc.stdout
    # an interrupt cancels the job by its tag, kills the ranks and what they started
    assert "interrupted stopped 2 rank processes and cancelled Spark job group" in proc.stdout
    assert "children left []" in proc.stdout and "after 0" in proc.stdout
    # DataFrames of the Connect session reach the ranks as disjoint shards, and train a model
    assert "shards 400 True train" in proc.stdout, proc.stdout
    assert "torch accuracy True" in proc.stdout, proc.stdout
    assert "slots np=3 needs 3 free Spark task slots at once (barrier mode), but the cluster " \
           "has 2 free of 2 (master local[2]" in proc.stdout
    # no live view: the cell says why, and the output, errors and value still come back
    assert "hvd_magics: no live view: HVD_MAGICS_LIVE=0 is set. The ranks' output" in proc.stderr
    assert "[1] line 2 of rank 1" in proc.stdout and "quiet value 0" in proc.stdout
    assert "quiet error rank 1 on" in proc.stdout and "boom from rank 1" in proc.stdout
    assert "quiet shards 400" in proc.stdout
    # an elastic job on Connect: a rank lost, the job goes on with the other
    assert "elastic [(1, 40)] [(1, ['the rank of task 1 exited with code -9'])]" in proc.stdout, \
        proc.stdout
    assert "quiet elastic an elastic job hands out ranks over the notebook's event channel, " \
           "which the executors cannot use here: HVD_MAGICS_LIVE=0 is set" in proc.stdout


SERVER_SCRIPT = textwrap.dedent('''
    import socket, threading, time
    from pyspark.sql import SparkSession
    # a classic session whose JVM serves Spark Connect (what remote("local[2]") starts)
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
             .config("spark.connect.grpc.binding.port", "{port}").getOrCreate())
    while True:
        try:
            socket.create_connection(("localhost", {port}), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    print("serving", flush=True)
    threading.Event().wait()
''')

LOST_SERVER_CLIENT = textwrap.dedent('''
    import sys, os, signal, subprocess, time, threading, glob
    sys.path.insert(0, {root!r})
    import cloudpickle
    from tests import jobs
    cloudpickle.register_pickle_by_value(jobs)
    from pyspark.sql import SparkSession
    from hvd_magics import HorovodJobError, HorovodRunner, HorovodMagicsError
    os.environ["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = "hvd-magics-test"  # the server's too

    def start_server():  # in an environment without the client's Spark Connect settings
        env = {{k: v for k, v in os.environ.items()
               if not k.startswith("SPARK_") or k == "SPARK_CONNECT_AUTHENTICATE_TOKEN"}}
        proc = subprocess.Popen([sys.executable, "-c", {server!r}], stdout=subprocess.PIPE,
                                text=True, start_new_session=True, env=env)
        assert proc.stdout.readline().strip() == "serving"
        return proc

    server = start_server()
    spark = SparkSession.builder.remote("sc://localhost:{port}").getOrCreate()
    print("before", HorovodRunner(np=2).run(jobs.print_lines, count=1), flush=True)
    marks = {marks!r}

    def kill_server():
        while len(glob.glob(marks + "/rank*")) < 2:
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()

    threading.Thread(target=kill_server, daemon=True).start()
    started = time.monotonic()
    try:
        HorovodRunner(np=2).run(jobs.sleep_in_allreduce, pid_dir=marks)
    except HorovodJobError as exc:
        print("lost after", round(time.monotonic() - started), "s:", str(exc).splitlines()[0])
        print("first failure:", exc.failures[0].headline())
    started = time.monotonic()
    try:
        HorovodRunner(np=2).run(jobs.print_lines, count=1)
    except HorovodMagicsError as exc:
        print("while down:", round(time.monotonic() - started), "s:", type(exc).__name__, exc)
    server = start_server()
    try:
        print("same session after restart", HorovodRunner(np=2).run(jobs.print_lines, count=1))
    except HorovodMagicsError as exc:
        print("same session after restart:", type(exc).__name__, str(exc).count(chr(10)), exc)
    spark.stop()  # as the error says
    spark = SparkSession.builder.remote("sc://localhost:{port}").getOrCreate()
    print("new session", HorovodRunner(np=2).run(jobs.print_lines, count=1), flush=True)
    spark.stop()
    os.killpg(server.pid, signal.SIGKILL)
    os._exit(0)  # the first session's client would retry its exit hook for ten minutes
''')


def test_a_connect_server_killed_mid_job_fails_it_in_seconds_naming_the_server(tmp_path):
    """The cell hung for about ten minutes (pyspark retried interruptTag against the dead
    server), then showed a raw SparkConnectGrpcException."""
    from tests.conftest import _free_port

    port = _free_port()
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "-c", LOST_SERVER_CLIENT.format(
        root=str(ROOT), port=port, marks=str(marks),
        server=SERVER_SCRIPT.format(port=port))], env=env, capture_output=True, text=True,
        timeout=400, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "before 0" in out
    lost = re.search(r"lost after (\d+) s: (.*)", out)
    assert lost and int(lost.group(1)) < 30, out
    assert f"the Spark Connect server at localhost:{port} does not answer" in out, out
    assert re.search(r"while down: \d s: SparkSessionLost the Spark Connect server at "
                     rf"localhost:{port} does not answer .*Fix: start the Spark Connect server "
                     r"again if it is down, then get a new session \(spark.stop\(\); spark = "
                     rf"SparkSession.builder.remote\('sc://localhost:{port}'\).getOrCreate\(\)\)",
                     out), out
    restart = re.search(r"same session after restart:? (.*)", out).group(1)
    assert restart == "0" or restart.startswith("SparkSessionLost 0 the Spark Connect session "), \
        restart  # it works, or it says in one line (0 line breaks) how to get a new session
    assert "new session 0" in out
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
