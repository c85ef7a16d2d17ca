"""Spark's warnings of the tasks a stop of ours kills, kept out of the cell (driver side,
classic Spark).

In a Jupyter kernel the JVM's standard error is the cell's, and a user's SparkSession logs at
``WARN``: cancelling a stopped job's stage made every killed task say so in whatever cell ran
next (``WARN TaskSetManager: Lost task 0.0 in stage 3.0 (TID 3) ...: TaskKilled (Stage
cancelled: [SPARK_JOB_CANCELLED] Job 2 cancelled ...)``), after the cell had said the job was
stopped. Spark says so when the task's end reaches the driver, which can be long after the
cancel, so the line is refused by a filter of log4j 2 that names the Spark jobs we cancelled
(no other line, and no other job's killed tasks). A filter of the whole configuration, not
the logger's own: a logger given a configuration of its own passes Spark's shell threshold and
printed every ``INFO`` line. When log4j 2 is not there, nothing is changed.
"""
from __future__ import annotations

import threading
from typing import Any
from collections.abc import Sequence

#: How many cancelled Spark jobs the filter names (the latest).
KEPT_JOBS = 100

_lock = threading.Lock()
#: The Spark jobs cancelled so far, and the filter now in place.
_hidden: dict[str, Any] = {"jobs": [], "filter": None}


def killed_task_pattern(spark_jobs: Sequence[int]) -> str:
    """The regular expression of Spark's line for a task killed by cancelling one of
    ``spark_jobs`` (matched against the whole formatted message)."""
    ids = "|".join(str(job) for job in spark_jobs)
    return rf"(?s)Lost task \S+ in stage .*TaskKilled .*\bJob (?:{ids}) cancelled\b.*"


def _hide(sc: Any, spark_jobs: Sequence[int]) -> None:
    """Put in place a filter that refuses the killed-task lines of ``spark_jobs`` too."""
    with _lock:
        jobs = [*_hidden["jobs"], *spark_jobs][-KEPT_JOBS:]
        try:
            log4j = sc._jvm.org.apache.logging.log4j  # noqa: SLF001 - pyspark's gateway
            result = getattr(log4j.core, "Filter$Result")
            new = log4j.core.filter.RegexFilter.createFilter(
                killed_task_pattern(jobs), None, False, result.DENY, result.NEUTRAL)
            context = log4j.LogManager.getContext(False)
            config = context.getConfiguration()
            if _hidden["filter"] is not None:
                config.removeFilter(_hidden["filter"])
            config.addFilter(new)
            context.updateLoggers()
        except Exception:  # noqa: BLE001,S110 - another logging back end: leave it as it is
            return
        _hidden.update(jobs=jobs, filter=new)


def cancel_quietly(sc: Any, spark_jobs: Sequence[int]) -> None:
    """Cancel the Spark jobs ``spark_jobs`` (ids) of ``sc`` without Spark's warning of each
    task it kills reaching the cell."""
    _hide(sc, spark_jobs)
    for spark_job in spark_jobs:
        sc._jsc.sc().cancelJob(spark_job)  # noqa: SLF001 - pyspark has no cancelJob
