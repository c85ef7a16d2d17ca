"""A kept step read back (:func:`restore`): from this host's memory, or from the keepers of the
hosts that hold it (:mod:`hvd_magics.rank.step_keeper`), all asked at once."""
from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from hvd_magics.common.kept_steps import PartName, parts_in, read_header, whole_steps
from hvd_magics.common.step_keeper_wire import fetch
from hvd_magics.errors import KeptStepUnreachable
from hvd_magics.protocol import ENV_KEEP_PARTS, ENV_KEEP_PEERS
from hvd_magics.rank.api.keeping import job_key, job_part_folder, wait
from hvd_magics.rank.api.state_tree import load_into, rebuild
from hvd_magics.rank.rank_job import rank_job


def newest_kept() -> int | None:
    """The newest step whole in this host's memory (this process's copy under way waited
    for), or ``None``."""
    wait()
    found = whole_steps(job_part_folder())
    return found[0] if found else None


def memory_step_newer_than(step: int | None) -> int | None:
    """The step this attempt resumes from the hosts' memory when it is newer than ``step`` (a
    checkpoint a library saved on a notice; ``None``: none), else ``None``."""
    job = rank_job()
    if job.resume_from != "memory" or job.resume_step is None:
        return None
    kept = int(job.resume_step)
    return kept if step is None or kept > step else None


def _this_part(step: int) -> PartName:
    """This rank's part of step ``step``: the whole of a replicated state, or the rank's own
    of a sharded one (on as many ranks as kept it).

    Raises
    ------
    KeptStepUnreachable
        The sharded step was kept by another number of ranks.
    """
    parts = int(os.environ.get(ENV_KEEP_PARTS) or 0)
    if not parts:  # outside a job of ours: what this host holds says it
        held = [p for p in parts_in(job_part_folder()) if p.step == step]
        parts = held[0].parts if held else 1
    if parts == 1:
        return PartName(step)
    import torch.distributed as dist
    if dist.get_world_size() != parts:
        raise KeptStepUnreachable(
            f"the step {step:,} this attempt resumes from was kept in the hosts' memory by "
            f"{parts} ranks, each its part, and this attempt has {dist.get_world_size()}: a "
            f"rank's part is read back by its rank only. The next attempt resumes from the "
            f"newest checkpoint file (which any number of ranks reads)")
    return PartName(step, dist.get_rank(), parts)


def _part_bytes(step: int) -> memoryview:
    """This rank's part of step ``step``, from this host's memory or a peer's keeper."""
    folder = job_part_folder()
    path = folder / _this_part(step).file
    try:
        with open(path, "rb") as handle:  # a private copy on write: a writable view, read
            return memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY))
    except FileNotFoundError:
        pass
    key, secret = job_key()
    peers = [p.split("=", 1)[1] for p in os.environ.get(ENV_KEEP_PEERS, "").split(",")
             if "=" in p]
    data, tried = _fetch_first(peers, key, secret, path.name)
    if data is not None:
        return memoryview(bytearray(data))
    raise KeptStepUnreachable(
        f"the step {step:,} this attempt resumes from was kept in the hosts' memory, and "
        f"neither this host nor a keeper that held it has it now (asked: "
        f"{', '.join(tried) or 'no other host'}). The next attempt resumes from the newest "
        "checkpoint file")


def _fetch_first(peers: list[str], key: str, secret: str,
                 name: str) -> tuple[bytes | None, list[str]]:
    """The part from the first of ``peers`` to give it (asked all at once: a lost host's keeper
    does not answer, and is not waited for), and what each one asked said."""
    if not peers:
        return None, []
    tried: list[str] = []
    pool = ThreadPoolExecutor(len(peers), thread_name_prefix="hvd-magics-fetch")
    asked = {pool.submit(fetch, address, key, secret, name): address for address in peers}
    try:
        for done in as_completed(asked):
            try:
                data = done.result()
            except OSError as exc:
                tried.append(f"{asked[done]} ({type(exc).__name__})")
                continue
            if data is not None:
                return data, tried
            tried.append(f"{asked[done]} (does not hold it)")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a silent host's answer not waited for
    return None, tried


def restore(state: Any, step: int) -> tuple[Any, int]:
    """``(state, step)`` with step ``step``'s kept part loaded into ``state`` (modules and
    optimizers in place; see :func:`~hvd_magics.rank.api.state_tree.load_into})."""
    data = _part_bytes(step)
    tree, start = read_header(data)
    values = rebuild(tree, data[start:])
    return load_into(state, values), step
