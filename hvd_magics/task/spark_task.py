"""What runs inside each Spark barrier task: plan the ranks, start one rank process, supervise it.

Every task calls ``allGather`` exactly once, whatever fails (a barrier stage hangs otherwise). The
task never raises: failures travel to the driver as events, so Spark never retries a stage that
already started ranks.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import traceback
from dataclasses import dataclass, field
from typing import Iterator

from hvd_magics.channel import ChannelAddress, EventClient
from hvd_magics.protocol import CUDA_VISIBLE_DEVICES, TASK_ERROR, TASK_STARTED
from hvd_magics.task.gpus import visible_devices
from hvd_magics.task.supervisor import RankProcess, rank_environment
from hvd_magics.task.slots import iface_for_address, plan_ranks, slot_env, start_rendezvous


@dataclass
class TaskSpec:
    """Everything a barrier task needs, shipped in the Spark closure."""

    payload: bytes
    channel: ChannelAddress
    env: dict[str, str] = field(default_factory=dict)


def barrier_task(spec: TaskSpec, _rows: Iterator) -> Iterator[str]:
    """The body of one barrier task; yields one JSON status line."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    partition = ctx.partitionId()
    hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
    server = None
    port = 0
    error = ""
    slots = []
    try:
        slots = plan_ranks(hosts)
        if slots[partition].rank == 0:
            server, port = start_rendezvous(slots)
    except BaseException:  # noqa: BLE001 - reported through allGather, never raised
        error = traceback.format_exc()
    gathered = [json.loads(m) for m in ctx.allGather(json.dumps({"port": port, "error": error}))]
    try:
        errors = [g["error"] for g in gathered if g["error"]]
        if errors:
            yield json.dumps({"partition": partition, "error": errors[0], "setup": True})
            return
        root_task = next(i for i, s in enumerate(slots) if s.rank == 0)
        slot = slots[partition]
        yield json.dumps(_supervise(spec, ctx, slot, hosts[partition], hosts[root_task],
                                    gathered[root_task]["port"]))
    finally:
        if server is not None:
            server.stop()


def _supervise(spec: TaskSpec, ctx, slot, host: str, root_host: str, port: int) -> dict:
    stopped = threading.Event()
    rank_proc: list[RankProcess] = []

    def on_driver_gone() -> None:
        stopped.set()
        for proc in rank_proc:
            proc.kill()

    client = EventClient(spec.channel, slot.rank, host, on_close=on_driver_gone)
    try:
        env = rank_environment(dict(os.environ), spec.env)
        env.update(slot_env(slot, root_host, port, iface_for_address(host)))
        gpus = ctx.resources().get("gpu")
        if gpus is not None and gpus.addresses:
            env[CUDA_VISIBLE_DEVICES] = visible_devices(gpus.addresses, os.environ)
        client.send(TASK_STARTED, partition=ctx.partitionId(), hostname=socket.gethostname(),
                    local_rank=slot.local_rank, pid=os.getpid())
        if stopped.is_set():
            return {"rank": slot.rank, "code": None, "stopped": True}
        proc = RankProcess(env, spec.payload, client.send)
        rank_proc.append(proc)
        if stopped.is_set():
            proc.kill()
        code = proc.wait()
        return {"rank": slot.rank, "code": code}
    except BaseException:  # noqa: BLE001
        try:
            client.send(TASK_ERROR, traceback=traceback.format_exc())
        except OSError:
            pass
        return {"rank": slot.rank, "error": traceback.format_exc()}
    finally:
        client.close()
