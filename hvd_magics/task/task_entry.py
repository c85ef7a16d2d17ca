"""The functions Spark runs in each barrier task, shipped by value.

It must run on an executor whose Python lacks hvd_magics (or one of its dependencies) too: then it
still takes part in the barrier's ``allGather`` (so no task waits forever) and returns the import
error as its result, which the driver shows with the fix. Only the standard library and pyspark
are used before the import succeeds; the module is registered with pyspark's cloudpickle by value
(:func:`hvd_magics.launch.spark_backend.barrier_function`), so executors never import it by name.
"""
from __future__ import annotations


def guarded_barrier_task(spec_blob: bytes, rows):  # noqa: ANN001, ANN201 - runs on executors
    """Import hvd_magics and run :func:`hvd_magics.task.spark_task.barrier_task`, or report why not."""
    import json
    import pickle
    import socket
    import sys
    import traceback

    from pyspark import BarrierTaskContext

    try:
        from hvd_magics.task.spark_task import barrier_task

        spec = pickle.loads(spec_blob)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver through Spark
        ctx = BarrierTaskContext.get()
        error = (f"the executor's Python ({sys.executable} on {socket.gethostname()}) cannot "
                 f"import hvd_magics: {type(exc).__name__}: {exc}")
        detail = traceback.format_exc()
        ctx.allGather(json.dumps({"port": 0, "error": error}))
        yield json.dumps({"partition": ctx.partitionId(), "error": error, "setup": True,
                          "traceback": detail})
        return
    yield from barrier_task(spec, rows)


def arrow_barrier_task(spec_blob: bytes, batches):  # noqa: ANN001, ANN201 - runs on executors
    """The task as a ``DataFrame.mapInArrow(..., barrier=True)`` function: one ``status`` string
    row out per task (the same JSON line as :func:`guarded_barrier_task`)."""
    import pyarrow as pa

    for line in guarded_barrier_task(spec_blob, batches):
        yield pa.RecordBatch.from_pydict({"status": [line]})


def slice_for_ranks(keys, source, batches):  # noqa: ANN001, ANN201 - runs on executors
    """Cut a DataFrame partition's Arrow batches into one slice per rank (``len(keys)`` ranks).

    Each slice leaves as one row ``(key, source, blob)``: ``blob`` is the slice in Arrow IPC
    stream form, ``key`` sends it to its rank's barrier task. A batch of ``m`` rows gives every
    rank ``m // n`` rows; its ``m % n`` remainder rows go one each to the next ranks in a rotation
    that starts at this partition's index, so shards differ by a few rows at most.
    """
    import pyarrow as pa
    from pyspark import TaskContext

    size = len(keys)
    context = TaskContext.get()
    turn = context.partitionId() % size if context is not None else 0
    for batch in batches:
        rows = batch.num_rows
        if rows == 0:
            continue
        base, extra = divmod(rows, size)
        counts = [base] * size
        for i in range(extra):
            counts[(turn + i) % size] += 1
        turn = (turn + extra) % size
        offset = 0
        out_keys, blobs = [], []
        for rank, count in enumerate(counts):
            if count == 0:
                continue
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch.slice(offset, count))
            offset += count
            out_keys.append(keys[rank])
            blobs.append(sink.getvalue().to_pybytes())
        yield pa.RecordBatch.from_arrays(
            [pa.array(out_keys, pa.int32()), pa.array([source] * len(blobs), pa.int32()),
             pa.array(blobs, pa.binary())], names=["key", "source", "blob"])
