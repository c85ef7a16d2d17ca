"""Spark's failures as a user reads them (hvd_magics/launch/spark_errors.py), from the texts a
JVM exception carries."""
from hvd_magics.launch.spark_errors import spark_error_text

#: What a barrier task that could not get ready raises, inside the JVM's text (pyspark 4.3).
_SETUP_FAILED = (
    "An error occurred while calling o87.collect.\n: org.apache.spark.SparkException: Job "
    "aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most "
    "recent failure reason: Stage failed because barrier task ResultTask(3, 1) finished "
    "unsuccessfully.\norg.apache.spark.api.python.PythonException: Traceback (most recent call "
    "last):\n  File \"/opt/app/hvd_magics.zip/hvd_magics/task/task_entry.py\", line 38, in run\n"
    "    yield from run_task(spec, ctx, rows)\n  File \"/opt/app/hvd_magics.zip/hvd_magics/task/"
    "spark_task.py\", line 294, in run_task\n    raise TaskSetupError(error)\n"
    "hvd_magics.task.spark_task.TaskSetupError: the shipped environment was packed for Python "
    "3.11, but its interpreter on the executor on h2 (Linux-x86_64) is Python 3.10. Fix: the "
    "same Python on the executors, or a conda environment (conda-pack carries the "
    "interpreter)\n\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handle"
    "PythonException(PythonRunner.scala:624)\n")


def test_a_tasks_own_setup_error_is_shown_alone_without_our_frames():
    """ShippedEnvironmentUnusable's right message came after a TaskSetupError traceback of
    hvd_magics' own frames."""
    text = spark_error_text(RuntimeError(_SETUP_FAILED))
    assert text.startswith("the shipped environment was packed for Python 3.11, but its "
                           "interpreter on the executor on h2"), text
    assert "Traceback" not in text and "task_entry.py" not in text and "\tat " not in text
    assert text.endswith("(conda-pack carries the interpreter)")


def test_another_python_error_keeps_its_traceback():
    other = _SETUP_FAILED.replace("hvd_magics.task.spark_task.TaskSetupError", "ValueError")
    text = spark_error_text(RuntimeError(other))
    assert text.startswith("the executor's Python failed:\nTraceback") and "ValueError" in text


#: What Spark said when an executor's disk filled while it unpacked the shipped environment.
_DISK_FULL = (
    "An error occurred while calling o112.collect.\n: org.apache.spark.SparkException: Job aborted"
    " due to stage failure: Task 1 in stage 3.0 failed 1 times, most recent failure: Lost task "
    "1.0 in stage 3.0 (TID 7) (10.77.0.3 executor 1): org.apache.spark.SparkException: tar: "
    "lib/python3.11/site-packages/torch/lib/libtorch_cpu.so: Cannot write: No space left on "
    "device\n\tat org.apache.spark.util.Utils$.unpack(Utils.scala:610)\n\tat org.apache.spark."
    "executor.Executor.$anonfun$updateDependencies$13(Executor.scala:1180)\n")


def test_a_disk_that_filled_while_unpacking_the_environment_is_named_with_the_space_needed():
    """``tar: ... No space left on device`` inside a JVM trace, no fix."""
    from hvd_magics.launch.spark_errors import disk_full_unpacking

    text = disk_full_unpacking(_DISK_FULL, 1_900_000_000)
    assert text.startswith("executor 1 on 10.77.0.3 ran out of disk space while Spark fetched "
                           "and unpacked the notebook's shipped environment (1.9 GB packed): it "
                           "needs about 6.7 GB free in the executor's work folder"), text
    assert "Fix: free that much there" in text and "\tat " not in text
    assert disk_full_unpacking("Lost task 1.0: java.io.IOException: broken pipe", 1) is None
