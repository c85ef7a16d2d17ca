"""Which GPUs a rank sees (``CUDA_VISIBLE_DEVICES``), through what its launcher was given.

A process that inherited ``CUDA_VISIBLE_DEVICES=2,3`` owns physical GPUs 2 and 3, which CUDA
calls 0 and 1 there. Indices handed out by Spark or by local rank are positions in that list, as
pyspark's TorchDistributor maps them (``_get_gpus_owned``).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from hvd_magics.protocol import CUDA_VISIBLE_DEVICES, ENGINE_TF

#: Where Linux lists NVIDIA GPUs without CUDA being initialised.
NVIDIA_GPUS_DIR = "/proc/driver/nvidia/gpus"


def owned_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The devices an inherited ``CUDA_VISIBLE_DEVICES`` lists, or ``None`` when it is unset."""
    value = environ.get(CUDA_VISIBLE_DEVICES)
    if value is None:
        return None
    return [d.strip() for d in value.split(",") if d.strip()]


def visible_devices(indices: Sequence[str | int], environ: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a rank given GPU ``indices``, mapped through ``environ``'s own.

    Raises
    ------
    ValueError
        When an index is not in the inherited list (the cluster's GPU discovery and the
        executor's ``CUDA_VISIBLE_DEVICES`` disagree).
    """
    owned = owned_devices(environ)
    if owned is None:
        return ",".join(str(i) for i in indices)
    try:
        return ",".join(owned[int(i)] for i in indices)
    except (IndexError, ValueError):
        raise ValueError(
            f"GPU indices {list(indices)} are not all in the inherited "
            f"{CUDA_VISIBLE_DEVICES}={environ[CUDA_VISIBLE_DEVICES]!r}: make the cluster's GPU "
            "discovery script and the executors' CUDA_VISIBLE_DEVICES agree") from None


def local_gpu_count(environ: Mapping[str, str] | None = None) -> int:
    """How many GPUs this process may use: its ``CUDA_VISIBLE_DEVICES``, else the machine's
    NVIDIA GPUs (without initialising CUDA)."""
    owned = owned_devices(os.environ if environ is None else environ)
    if owned is not None:
        return len(owned)
    try:
        return len(os.listdir(NVIDIA_GPUS_DIR))
    except OSError:
        return 0


def task_share(addresses: Sequence[str], ranks: int, lane: int) -> list[str]:
    """The GPUs of a task's rank ``lane`` of ``ranks``: one each when the task holds one per rank,
    an equal part when it holds a multiple, else all of them (the ranks share them)."""
    if not addresses:
        return []
    if len(addresses) % ranks == 0:
        part = len(addresses) // ranks
        return list(addresses[lane * part:(lane + 1) * part])
    return list(addresses)


def rank_devices(engine: str, host_gpus: Sequence[Sequence[str]], local_rank: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` of the rank ``local_rank`` of a host whose ranks hold
    ``host_gpus`` (by local rank), or ``None`` when it holds none.

    When each rank of the host holds one GPU of its own, a Horovod or torch rank sees the host's
    GPUs in local-rank order, as under horovodrun and torchrun: ``torch.cuda.set_device(
    LOCAL_RANK)`` and ``hvd.local_rank()``'s pinning pick its own. A tf.distribute rank sees only
    its own (a ``MultiWorkerMirroredStrategy`` worker would take every GPU it sees). Otherwise
    (GPUs shared, or several per rank) a rank sees what it holds.
    """
    own = list(host_gpus[local_rank]) if local_rank < len(host_gpus) else []
    if not own:
        return None
    every = [gpu for gpus in host_gpus for gpu in gpus]
    one_each = all(len(gpus) == 1 for gpus in host_gpus) and len(set(every)) == len(every)
    if engine == ENGINE_TF or not one_each:
        return ",".join(own)
    return ",".join(every)
