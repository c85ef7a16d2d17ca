"""The functions Spark runs in each barrier task, shipped by value.

It must run on an executor whose Python lacks hvd_magics (or one of its dependencies) too: then a
barrier task raises the import error, which fails the stage (so no task waits forever for it to
meet them) and which the driver shows with the fix; an elastic job's task returns it as its
result. Only the standard library and pyspark
are used before the import succeeds; the module is registered with pyspark's cloudpickle by value
(:func:`hvd_magics.launch.spark_backend.barrier_function`), so executors never import it by name.
"""
from __future__ import annotations


def guarded_barrier_task(spec_blob: bytes, rows):  # noqa: ANN001, ANN201 - runs on executors
    """Import hvd_magics and run :func:`hvd_magics.task.spark_task.barrier_task`, or report why
    not."""
    import json
    import pickle
    import socket
    import sys
    import traceback

    from pyspark import BarrierTaskContext

    try:
        from hvd_magics.task.spark_task import barrier_task
        from hvd_magics.task.elastic_task import elastic_task
        from hvd_magics.task.worker_heap import freeze_once

        freeze_once(__name__)  # the modules: Spark's collection after each task skips them
        spec = pickle.loads(spec_blob)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver through Spark
        from pyspark import TaskContext

        ctx = TaskContext.get()
        elastic = not isinstance(ctx, BarrierTaskContext)  # an elastic job's stage is not
        error = (f"the executor's Python ({sys.executable} on {socket.gethostname()}) cannot "
                 f"import hvd_magics: {type(exc).__name__}: {exc}")
        if not elastic:
            # the other tasks may be waiting to meet through the driver, which this task cannot
            # reach: fail the stage (Spark stops them; the driver shows this error and the fix)
            raise RuntimeError(error) from None
        yield json.dumps({"partition": ctx.partitionId(), "error": error, "setup": True,
                          "traceback": traceback.format_exc()})
        return
    yield from (elastic_task if spec.elastic else barrier_task)(spec, rows)
    if not spec.sources:
        # the stage runs over spark.range (a row or two a task): read the rest, so that Spark
        # keeps this Python worker for the next job. A worker that leaves input unread is not
        # reused: every job forked new ones, which imported pyarrow and pandas again (0.4 CPU s
        # a task here). A job that reads a DataFrame has read all its rows into its shards.
        for _ in rows:
            pass


def arrow_barrier_task(spec_blob: bytes, batches):  # noqa: ANN001, ANN201 - runs on executors
    """The task as a ``DataFrame.mapInArrow(..., barrier=True)`` function: one ``status`` string
    row out per task (the same JSON line as :func:`guarded_barrier_task`)."""
    for line in guarded_barrier_task(spec_blob, batches):
        yield status_batch(line)


def status_batch(line: str):  # noqa: ANN201 - a pyarrow.RecordBatch
    """The one-row ``status`` batch a task returns, built from its buffers: ``pa.array`` and
    ``from_pydict`` import pandas (half a second, at the end of every job)."""
    import struct

    import pyarrow as pa

    data = line.encode()
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    status = pa.StringArray.from_buffers(1, offsets, pa.py_buffer(data))
    return pa.RecordBatch.from_arrays([status], names=["status"])

