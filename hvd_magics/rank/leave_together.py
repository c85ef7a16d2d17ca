"""Leaving the job's engine together: a rank whose code returned waits until its peers are done
with it before its process ends (:func:`end_engine`, the last thing a rank does).

A rank that left early took away what a peer still used: Horovod's background loop, the
``torch.distributed`` store rank 0 holds, the buffers a ``tf.distribute`` peer was still fetching.
None of the ways of leaving is a collective: a peer left in an extra collective of its own waits
there alone, where the driver sees it and ends the job naming both
(:func:`hvd_magics.job.runner.left_behind`).
"""
from __future__ import annotations

import contextlib
import datetime
import sys
import time
from typing import Any
from collections.abc import Callable

from hvd_magics.errors import exception_text
from hvd_magics.rank.rank_job import rank_job


def _end_horovod() -> None:
    """Leave Horovod together: wait until every rank is done (``join``), then shut down.

    Without this, a rank that exits while a peer's background loop still talks to it makes that peer
    print ``Horovod background loop uncaught exception ... Connection reset by peer``. The Join is
    marked as this rank's last (our patch of Horovod, ``hvd_magics/horovod/patches.py``): a peer
    that still submits a collective gets an error naming this rank and the tensor, where a plain
    ``hvd.join()`` would hand it zeros in this rank's place.
    """
    for name in ("horovod.torch", "horovod.tensorflow"):
        module = sys.modules.get(name)
        try:
            if module is None or not module.is_initialized():
                continue
            module.mpi_ops._basics.MPI_LIB_CTYPES.horovod_hvd_magics_finished()
            _join_asleep(module)
            module.shutdown()
        except Exception as exc:  # noqa: BLE001 - a peer that failed is reported by its own rank
            if "Horovod has been shut down" not in exception_text(exc):  # a peer failed: it says so
                print(f"hvd_magics: leaving Horovod ({name}) failed: {exception_text(exc)}",
                      file=sys.stderr)


#: How often a finished rank looks whether its peers have joined: from the first to the last
#: interval, doubling (seconds).
JOIN_POLL_S = (0.0005, 0.02)


def _join_asleep(module: Any) -> None:
    """``module.join()``, waiting asleep: Horovod's torch ``join`` waits in a loop of
    ``sched_yield`` (``WaitAndClear``), which kept a core busy for as long as a peer still worked
    (a rank done 8 s before its peer burned 11.7 CPU seconds; on a shared host those are the
    peer's). TensorFlow's join blocks in its runtime and is called as it is."""
    if module.__name__ != "horovod.torch":
        module.join()
        return
    import torch

    mpi_ops = module.mpi_ops
    output = torch.tensor(-1, dtype=torch.int)
    try:
        handle = mpi_ops.mpi_lib.horovod_torch_join(output, -1)
    except RuntimeError as exc:
        raise mpi_ops.HorovodInternalError(exc) from exc
    mpi_ops._handle_map[handle] = (None, output)  # noqa: SLF001 - what join() itself does
    delay, longest = JOIN_POLL_S
    while not module.poll(handle):
        time.sleep(delay)
        delay = min(2 * delay, longest)
    module.synchronize(handle)  # done: raises a peer's failure as join() would


def _end_torch() -> None:
    """Leave a ``torch.distributed`` process group together, then destroy it: each rank marks
    itself done in the group's store and waits until every rank has (so that no rank takes the
    store away from a peer still in its last collective). A group the job's code destroyed
    itself is left the same way, through the store kept with it
    (:func:`hvd_magics.rank.torch_group_hold.kept_default`): rank 0, which holds the store, had
    ended while a peer was still inside ``init_process_group`` reading it.

    Not a collective: a barrier here was matched with a peer's extra ``all_reduce`` (the ranks
    made different calls) and hung both, where the driver now sees the peer wait alone in its
    collective and ends the job naming both (:func:`hvd_magics.job.runner.left_behind`).
    """
    from hvd_magics.rank import torch_group_hold

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available():
            return
        live = dist.is_initialized()
        if live:
            store = dist.distributed_c10d._get_default_store()  # noqa: SLF001 - the group's own
            me, size = dist.get_rank(), dist.get_world_size()
        elif (kept := torch_group_hold.kept_default()) is not None:
            store, me, size = kept.store, kept.rank, kept.size  # the job destroyed it itself
        else:
            return
        _leave_through(lambda key: store.set(key, "1"),
                       lambda keys, seconds: store.wait(
                           keys, datetime.timedelta(seconds=seconds or _FOREVER_S)),
                       me, list(range(size)), 0)  # rank 0 holds the store
        if live:
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - a peer that failed is reported by its own rank
        print(f"hvd_magics: leaving torch.distributed failed: {exception_text(exc)}",
              file=sys.stderr)


#: The keys a rank sets in its engine's store when it leaves (its name appended), and once it no
#: longer waits on the store (the rank that holds the store waits for those); how long that
#: rank waits for them, and "for ever" (seconds).
_LEFT_KEY, _GONE_KEY = "hvd_magics/left/", "hvd_magics/gone/"
_GONE_WAIT_S, _FOREVER_S = 60.0, 7 * 24 * 3600.0
#: How long one look for a tf.distribute peer's key blocks (milliseconds): TensorFlow holds the
#: GIL while it waits, and the rank's stack answers wait for it.
_TF_LOOK_MS = 200


def _leave_through(set_key: Callable[[str], None],
                   wait_keys: Callable[[list[str], float | None], None], me: Any,
                   everyone: list[Any], holder: Any) -> None:
    """Leave through a key-value store: mark ``me`` left, wait until ``everyone`` has, then
    mark ``me`` gone; the ``holder`` of the store (whose end takes it away) instead waits until
    every other is gone. ``wait_keys(keys, seconds)`` waits for all ``keys``, ``None``: for
    ever."""
    set_key(f"{_LEFT_KEY}{me}")
    wait_keys([f"{_LEFT_KEY}{name}" for name in everyone], None)
    if me != holder:
        # the holder ends as soon as it reads the key, which may be before its answer to this
        # set arrives: a worker of a job that succeeded printed 'leaving tf.distribute failed:
        # Socket closed (InsertKeyValue)'. Nothing is left to do with the store either way.
        with contextlib.suppress(Exception):
            set_key(f"{_GONE_KEY}{me}")
        return
    wait_keys([f"{_GONE_KEY}{name}" for name in everyone if name != me], _GONE_WAIT_S)


def _end_tf() -> None:
    """Leave a ``tf.distribute`` cluster together, through the key-value store of TensorFlow's
    coordination service (which ``MultiWorkerMirroredStrategy`` starts): each worker marks
    itself left and waits until every worker has. A worker done with its last collective had
    left while a peer still fetched its part of it (``WorkerService/RecvBuf``), and the peer's
    collective failed with ``Collective ops is aborted by: Socket closed`` (10 jobs of 10 on two
    hosts, one behind a 100 Mbit/s link). The service's leader goes last, once every other worker
    is done with the service (a worker whose answer was lost with the leader saw
    ``Socket closed``).

    Not a collective, and not the service's barrier (which holds the GIL while it waits, so the
    rank could not answer for its stack): a worker still in an extra collective of its own waits
    there alone, and the driver ends the job naming both
    (:func:`hvd_magics.job.runner.left_behind`)."""
    context_module = sys.modules.get("tensorflow.python.eager.context")
    try:
        if context_module is None:
            return
        context = context_module.context()
        config = context.coordination_service
        if config is None or not context._context_handle:  # noqa: SLF001 - TF's own check
            return  # no multi-worker strategy was made: nothing to leave
        task = rank_job().tf_task
        me = f"/job:{task.get('type')}/replica:0/task:{task.get('index')}"
        everyone = [f"/job:{job.name}/replica:0/task:{index}"
                    for job in config.coordinated_job_list for index in range(job.num_tasks)]
        _leave_through(lambda key: context.set_config_key_value(key, "1"),
                       lambda keys, seconds: _tf_wait_for_keys(context, keys, seconds), me,
                       everyone, config.service_leader)
    except Exception as exc:  # noqa: BLE001 - a peer that failed is reported by its own rank
        print(f"hvd_magics: leaving tf.distribute failed: {exception_text(exc)}",
              file=sys.stderr)


def _tf_wait_for_keys(context: Any, keys: list[str], seconds: float | None) -> None:
    """Wait until every one of ``keys`` is set in the coordination service (for ``seconds`` at
    most, when given), in short looks with the GIL free between them."""
    from tensorflow.python.framework import errors

    deadline = None if seconds is None else time.monotonic() + seconds
    for key in keys:
        while True:
            try:
                context.get_config_key_value(key, _TF_LOOK_MS)
                break
            except errors.DeadlineExceededError:
                if deadline is not None and time.monotonic() > deadline:
                    raise
                time.sleep(0.01)


def end_engine() -> None:
    """Leave the job's engine together with the other ranks (Horovod, torch.distributed or
    tf.distribute)."""
    _end_horovod()
    _end_torch()
    _end_tf()
