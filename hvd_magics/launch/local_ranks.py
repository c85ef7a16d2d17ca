"""Make sure no rank process is left on this host after a job (or a pool) ended."""
from __future__ import annotations

import time
from collections.abc import Iterable

from hvd_magics.protocol import RANK_MODULE, ZYGOTE_MODULE
from hvd_magics.task.slots import local_addresses

#: After a stop, how long rank processes on this host get to exit before we kill them ourselves.
RANK_EXIT_WAIT_S = 10.0


def reap_local_ranks(ranks: Iterable[tuple[int | None, str]]) -> None:
    """Wait for the rank processes ``(pid, host)`` that run on this host to exit; kill the rest.

    The stop order (closed channel, cancelled Spark stage) kills ranks asynchronously; wait for
    them, and kill what is left. Only processes that run ``hvd_magics.rank.rank_main`` (or were
    forked from a zygote, ``hvd_magics.rank.zygote``) are touched.
    """
    import psutil

    local = local_addresses()
    procs, exiting = [], []
    for pid, host in ranks:
        if pid is None or host not in local:
            continue
        try:
            proc = psutil.Process(pid)
            command = proc.cmdline()
            if any(module in " ".join(command) for module in (RANK_MODULE, ZYGOTE_MODULE)):
                procs.append(proc)
            elif not command and proc.status() != psutil.STATUS_ZOMBIE:
                # killed and still exiting: its memory (and command line) is gone, its exit is
                # not done yet; waited for like the others (seen in CI: such a rank was
                # skipped, and was still there when the job said nothing is left running)
                exiting.append(proc)
        except psutil.Error:
            continue

    def running(proc: psutil.Process) -> bool:
        try:
            return proc.status() != psutil.STATUS_ZOMBIE  # a zombie has exited
        except psutil.Error:
            return False

    def still_running(procs: list[psutil.Process]) -> list[psutil.Process]:
        deadline = time.monotonic() + RANK_EXIT_WAIT_S
        while procs and time.monotonic() < deadline:
            procs = [proc for proc in procs if running(proc)]
            if procs:
                time.sleep(0.05)
        return procs

    for proc in still_running(procs + exiting):
        if proc in procs:  # only a process seen running a rank is killed
            try:
                proc.kill()
            except psutil.Error:
                pass
    # a kill is delivered, not done: the caller says nothing is left, so see them go
    still_running(procs + exiting)
