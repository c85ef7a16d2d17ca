"""Spark as users start it: their own SparkSession with none of our settings."""
import os
import subprocess
import sys
import textwrap

import pytest

from hvd_magics.launch.spark_errors import spark_error_text
from tests.conftest import ROOT

USER_SCRIPT = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    import cloudpickle
    from tests import jobs
    cloudpickle.register_pickle_by_value(jobs)
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    print("executors would run", spark.sparkContext.pythonExec)
    from hvd_magics import HorovodRunner, HorovodJobError
    result = HorovodRunner(np=2).run(jobs.torch_allreduce)
    print("sums", [r["sum"] for r in result])
    try:
        HorovodRunner(np=2).run(jobs.fail_on_rank, bad_rank=1, how="raise")
    except HorovodJobError as exc:
        print("error", exc.failures[0].headline())
    print("again", HorovodRunner(np=2).run(jobs.print_lines, count=1))
    spark.stop()
''')


def _bare_python_first(tmp_path) -> dict:
    """An environment whose ``python3`` is an interpreter without our packages (no psutil, no
    hvd_magics), as on a machine where the notebook runs in a virtual environment, and no
    PYSPARK_PYTHON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys._base_executable)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    check = subprocess.run(["python3", "-c", "import psutil, hvd_magics"], env=env,
                           capture_output=True, cwd=tmp_path)
    assert check.returncode != 0, "the bare interpreter must lack our packages for this test"
    return env


def test_a_session_started_without_pyspark_python_runs_jobs(tmp_path):
    """Regression: executors ran the system python3 without our packages; every run failed."""
    env = _bare_python_first(tmp_path)
    proc = subprocess.run([sys.executable, "-c", USER_SCRIPT.format(root=str(ROOT))], env=env,
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "executors would run python3" in proc.stdout
    assert "sums [3.0, 3.0]" in proc.stdout
    assert "error rank 1 on" in proc.stdout and "ValueError: boom from rank 1" in proc.stdout
    assert "again 0" in proc.stdout


PY4J_TEXT = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from a "
    "failed barrier ResultStage. Most recent failure reason: Stage failed because barrier task "
    "ResultTask(0, 1) finished unsuccessfully.\n"
    "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
    '  File "/usr/lib/python3/pyspark/worker.py", line 1900, in main\n'
    "    func, profiler, deserializer, serializer = read_command(pickleSer, infile)\n"
    '  File "/work/hvd_magics/spark_task.py", line 17, in <module>\n'
    "    import psutil\n"
    "ModuleNotFoundError: No module named 'psutil'\n"
    "\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException\n"
    "\tat org.apache.spark.rdd.RDD.collect(RDD.scala:1049)\n"
    "\tat py4j.Gateway.invoke(Gateway.java:282)\n")


PY4J_TEXT_43 = (  # pyspark 4.3's form: [PYTHON_EXCEPTION], then JVM stacktrace after a marker
    "An error occurred while calling o115.collectToPython.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not recover from "
    "a failed barrier ResultStage.\n"
    "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown "
    "from the Python worker: Traceback (most recent call last):\n"
    '  File "/x/pyspark.zip/pyspark/worker.py", line 4207, in invoke_udf\n'
    "    func, profiler, deserializer, serializer = read_udfs(\n"
    "                                               ^^^^^^^^^^\n"
    "\n"
    '  File "/x/pyspark.zip/pyspark/sql/pandas/types.py", line 93, in to_arrow_type\n'
    "    import pyarrow as pa\n"
    "ModuleNotFoundError: No module named 'pyarrow'\n"
    "\n"
    "JVM stacktrace:\n"
    "org.apache.spark.SparkException\n"
    "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException\n")


#: pyspark's own text for a task that failed in the Python worker and was retried (an elastic
#: job's stage is not a barrier stage).
PYSPARK_WORKER_TEXT = (
    "An exception was thrown from the Python worker. Please see the stack trace below.\n"
    "Traceback (most recent call last):\n"
    '  File "/x/pyspark/worker.py", line 4207, in invoke_udf\n'
    "    func, profiler, deserializer, serializer = read_udfs(\n"
    "ModuleNotFoundError: No module named 'pyarrow'\n"
    "\n"
    "JVM stacktrace:\n"
    "org.apache.spark.SparkException: Job aborted due to stage failure\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages\n")


@pytest.mark.parametrize("jvm_text, last_line", [
    (PY4J_TEXT, "ModuleNotFoundError: No module named 'psutil'"),
    (PY4J_TEXT_43, "ModuleNotFoundError: No module named 'pyarrow'"),
    (PYSPARK_WORKER_TEXT, "ModuleNotFoundError: No module named 'pyarrow'"),
])
def test_spark_failures_show_the_executors_python_error_not_jvm_frames(jvm_text, last_line):
    text = spark_error_text(RuntimeError(jvm_text))
    assert text.startswith("the executor's Python failed:\nTraceback") and text.endswith(last_line)
    assert "\tat " not in text and "py4j" not in text and "JVM" not in text
    lost = spark_error_text(RuntimeError(
        "Job aborted due to stage failure: ExecutorLostFailure (executor 1 exited caused by one "
        "of the running tasks) Reason: Command exited with code 137\n\tat org.apache.Foo\n"))
    assert lost == ("an executor was lost (executor 1 exited caused by one of the running tasks: "
                    "Command exited with code 137)")
