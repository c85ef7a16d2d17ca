"""Spark's failures as a user should read them: the executor's Python traceback out of a JVM
exception's text, a lost executor's reason, and the fix when the executors lack our packages."""
from __future__ import annotations

import re

#: What to do when the executors' Python lacks a package the job needs.
MISSING_PACKAGES_FIX = (
    "\nFix: ship the notebook's environment with every job: hvd_magics.ship_environment() "
    "(%hvd_env ship); or install the frameworks and pyarrow on every executor, or point the "
    "executors at an interpreter that has them: in the notebook, os.environ[\"PYSPARK_PYTHON\"] "
    "= \"/path/to/python\" before the SparkSession starts (pyspark reads that variable when "
    "its context starts; spark.pyspark.python set on the session builder of a running notebook "
    "does not reach the executors, only spark-submit reads it), then start the SparkSession "
    "again (hvd_magics itself travels with the job).")
#: The same when the notebook's environment is shipped: it lacks the package.
SHIPPED_MISSING_FIX = (
    "\nFix: install it in the notebook (%pip install ...); the next job ships the environment "
    "again, with it.")


#: How :func:`spark_error_text` begins when the stage lost an executor.
EXECUTOR_LOST = "an executor was lost"
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure \(([^)]*)\)(?:\s*Reason: ([^\n]*))?")


#: Where the Python traceback inside a JVM exception's text ends (pyspark 4.0 and 4.3 forms).
_TRACEBACK_ENDS = ("\n\tat ", "\nJVM stacktrace", "\n\n\n")


#: Lines of a Python traceback from an executor that are shown.
TRACEBACK_LINES = 15
#: The last line of a task's traceback that raised the setup error the task had already put
#: in words (``hvd_magics.task.spark_task.TaskSetupError``): what follows is shown alone.
_OWN_SETUP_ERROR = re.compile(r"^(?:[\w.]+\.)?TaskSetupError: ", re.M)


#: Where a failed task ran, in Spark's text: ``(TID 9) (10.77.0.3 executor 1)``.
_TASK_PLACE = re.compile(r"\(TID \d+\) \(([^ ()]+) executor ([^ ()]+)\)")


def disk_full_unpacking(text: str, archive_bytes: int) -> str | None:
    """What to say when an executor's disk filled while Spark unpacked the shipped
    environment's archive of ``archive_bytes`` (``tar: ... No space left on device`` inside a
    JVM trace), or ``None`` when ``text`` says nothing of a full disk."""
    if "No space left on device" not in text:
        return None
    place = _TASK_PLACE.search(text)
    where = f"executor {place.group(2)} on {place.group(1)}" if place else "an executor"
    needed = archive_bytes * 3.5 / 1e9  # the archive and what it unpacks to (about 2.5 times)
    return (f"{where} ran out of disk space while Spark fetched and unpacked the notebook's "
            f"shipped environment ({archive_bytes / 1e9:.1f} GB packed): it needs about "
            f"{needed:.1f} GB free in the executor's work folder (SPARK_WORKER_DIR, or the "
            f"YARN/Kubernetes container's local folder) on that host. Fix: free that much "
            f"there (Spark leaves the half-unpacked folder hvd_env_<key> in the application's "
            f"work folder: remove it, or end the application with spark.stop()), give the "
            f"executors larger disks, or ship a smaller environment (remove what the job does "
            f"not need).")


def executor_lost_reason(text: str) -> str | None:
    """``"executor 1 exited ...: Command exited with code 137"`` from a Spark error, if any."""
    match = _EXECUTOR_LOST.search(text)
    if match is None:
        return None
    return f"{match.group(1)}" + (f": {match.group(2).strip()}" if match.group(2) else "")


def executor_was_lost(said: str) -> bool:
    """Whether a Spark failure as :func:`spark_error_text` says it is an executor lost."""
    return said.startswith(EXECUTOR_LOST) or "ExecutorLostFailure" in said


def python_traceback(text: str) -> str | None:
    """The executor's Python traceback inside a Spark (JVM) error's text, or ``None`` (after
    ``PythonException`` in the JVM's text, or pyspark's own ``An exception was thrown from the
    Python worker`` that a retried task's failure becomes)."""
    start = max(text.find("PythonException"), text.find("thrown from the Python worker"))
    start = text.find("Traceback (most recent call last):", max(start, 0)) if start >= 0 else -1
    if start < 0:
        return None
    ends = [i for i in (text.find(marker, start) for marker in _TRACEBACK_ENDS) if i >= 0]
    return text[start:min(ends, default=len(text))].rstrip()


def spark_error_text(exc: BaseException) -> str:
    """A Spark-side failure as a user should see it: the executor's Python traceback when there
    is one, else the Spark message's own lines without JVM frames."""
    text = str(exc)
    traceback_text = python_traceback(text) or ""
    said = list(_OWN_SETUP_ERROR.finditer(traceback_text))
    if said:  # our frames add nothing to what the task said
        return traceback_text[said[-1].end():].strip()
    if traceback_text:
        lines = [ln for ln in traceback_text.splitlines() if ln.strip()]
        shown = lines[-TRACEBACK_LINES:]
        if len(lines) > len(shown):
            shown = [lines[0], "  ..."] + shown
        return "the executor's Python failed:\n" + "\n".join(shown)
    lost = executor_lost_reason(text)
    if lost:
        return f"{EXECUTOR_LOST} ({lost})"
    lines = [ln for ln in text.strip().splitlines()
             if ln.strip() and not ln.startswith(("\tat ", "\t... ")) and "py4j" not in ln]
    return "\n".join(lines[:5])

