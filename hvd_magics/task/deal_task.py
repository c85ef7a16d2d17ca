"""The Spark task that deals a DataFrame's rows to a warm pool's ranks (executor side).

It runs in an ordinary (not barrier) stage over the job's tagged rows
(:func:`hvd_magics.launch.dataframe_input.sharded_input`), beside the pool's barrier stage: task
``p`` streams its partition to rank ``p``'s :class:`hvd_magics.task.shard_receiver.ShardReceiver`
and returns one JSON status line. It never raises: a failure is its status line, so Spark does
not run it again.
"""
from __future__ import annotations

import json
import pickle
import socket
import traceback
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import Iterator


@dataclass(frozen=True)
class DealSpec:
    """What each dealing task needs, shipped in the Spark closure.

    ``targets[p]`` is the ``(host, port)`` of rank ``p``'s receiver; ``names`` maps each
    source index of the deal to its name; ``secret`` is the pool's channel secret.
    """

    job_id: str
    secret: bytes
    names: dict[int, str]
    targets: tuple[tuple[str, int], ...]


def deal_partition(spec: DealSpec, partition: int, batches: Any) -> dict[str, Any]:
    """Send one partition's rows to its rank; its status (the rank, what was written, or the
    error)."""
    from hvd_magics.task.shard_receiver import send_rows

    target = cast("tuple[str, int]", tuple(spec.targets[partition]))
    try:
        shards = send_rows(target, spec.secret, spec.job_id, spec.names, batches)
        return {"rank": partition, "shards": shards}
    except ConnectionError as exc:
        return {"rank": partition, "error": str(exc)}
    except Exception:  # noqa: BLE001 - reported to the driver, which shows it
        return {"rank": partition,
                "error": f"dealing to {target[0]}:{target[1]} from {socket.gethostname()}: "
                         + traceback.format_exc()}


def arrow_deal_task(spec_blob: bytes, batches: Any) -> Iterator[Any]:
    """The ``mapInArrow`` function of the dealing stage: one ``status`` row out per task."""
    from pyspark import TaskContext

    from hvd_magics.task.task_entry import status_batch

    spec = pickle.loads(spec_blob)  # noqa: S301 - our own closure, from the driver
    status = deal_partition(spec, TaskContext.get().partitionId(), batches)
    yield status_batch(json.dumps(status))
