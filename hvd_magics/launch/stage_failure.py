"""Why a job's Spark stage failed, as the user reads it: a task's setup error, an executor's disk
that filled while it unpacked the shipped environment, Spark's error as the executor's Python
error (never JVM frames), the fix for missing modules; and how long a start timeout allows the
executors to unpack a newly sent environment."""
from __future__ import annotations

from typing import Any

from hvd_magics.launch.environment_shipping import EnvironmentChoice
from hvd_magics.launch.spark_errors import (MISSING_PACKAGES_FIX, SHIPPED_MISSING_FIX,
                                            disk_full_unpacking, spark_error_text)
from hvd_magics.launch.spark_session import executors_run_this_python

#: The slowest rates at which an executor is expected to fetch the shipped environment's
#: archive from the driver and write it unpacked (bytes a second), and how much larger it is
#: unpacked (venv-pack's gzip level 1 of a PyTorch and TensorFlow venv: 1.9 GB -> 4.8 GB).
FETCH_BYTES_PER_S = 10e6
UNPACK_BYTES_PER_S = 20e6
UNPACKED_PER_ARCHIVE_BYTE = 2.5


def stage_failure(spark: Any, results: list[dict[str, Any]], error: BaseException | None,
                  environment: EnvironmentChoice | None) -> str | None:
    """Why the stage failed, from the tasks' status lines ``results`` and the ``error`` its
    collection raised; ``None`` when it did not."""
    setup = [r for r in results if r.get("setup")]
    full = (disk_full_unpacking(str(error), environment.archive_bytes())
            if error is not None and environment is not None else None)
    if setup:
        text = setup[0]["error"]
    elif full is not None:
        return full
    elif error is not None:
        text = spark_error_text(error)
    else:
        return None
    if "cannot import hvd_magics" in text or "No module named" in text:
        text += missing_module_fix(spark, environment)
    return text


def missing_module_fix(spark: Any, environment: EnvironmentChoice | None) -> str:
    """The executors lack a module: ship the environment (or install it in the notebook, when it
    is shipped); nothing on a local master, whose ranks run this very Python."""
    if executors_run_this_python(spark):
        return ""
    return SHIPPED_MISSING_FIX if environment is not None else MISSING_PACKAGES_FIX


def unpacking_allowance(sent_archive: int) -> tuple[float, str] | None:
    """When a job sent the executors the environment's archive of ``sent_archive`` bytes (the
    first job of the application after it changed): Spark fetches and unpacks it on each
    executor before the task's Python starts, which the start timeout must not count; the
    seconds allowed for it at the slowest rates a cluster is expected to have, and what it is."""
    if not sent_archive:
        return None
    seconds = sent_archive / FETCH_BYTES_PER_S + UNPACKED_PER_ARCHIVE_BYTE * \
        sent_archive / UNPACK_BYTES_PER_S
    return seconds, (f"the executors fetch and unpack the notebook's environment "
                     f"({sent_archive / 1e9:.1f} GB packed) before its ranks start")
