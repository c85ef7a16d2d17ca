"""What runs inside each Spark barrier task: plan the ranks, write the task's DataFrame shards,
start one rank process, supervise it.

Every task takes part in the tasks' meeting (:mod:`hvd_magics.task.task_meeting`), whatever
fails: a barrier stage hangs otherwise. Once it can meet, the task never raises: failures travel to
the driver as events or as its status line, so Spark never retries a stage that already started
ranks. Only a task that cannot meet the others through the driver raises, before any rank starts,
so that the stage fails and Spark stops the tasks that wait for it.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

from hvd_magics.channel import ChannelAddress, EventClient
from hvd_magics.protocol import (CUDA_VISIBLE_DEVICES, DROP_SHARDS, END_POOL, ENV_DRIVER_HOST,
                                 ENGINE_HOROVOD, ENV_LIVE, ENV_SHARDS, INTERRUPT_CELL, MEET,
                                 RUN_CELL, SHARDING, TAKE_STACKS, TASK_ERROR, TASK_STARTED)
from hvd_magics.task.engines import PortOffer, engine_of, meet_env, offers_port, start_env
from hvd_magics.task.event_buffer import EventBuffer
from hvd_magics.task.gpus import visible_devices
from hvd_magics.task.shard_files import (ShardFile, ShardSpaceError, empty_shards, null_values,
                                         remove_shards, shard_folder, write_shards)
from hvd_magics.task.shard_receiver import ShardReceiver
from hvd_magics.task.shipped_environment import rank_python
from hvd_magics.task.supervisor import RankProcess, rank_environment
from hvd_magics.task.task_meeting import BY_DRIVER, TaskMeeting
from hvd_magics.task.slots import (iface_for_address, plan_ranks, start_rendezvous,
                                   stop_rendezvous)


@dataclass
class TaskSpec:
    """Everything a barrier task needs, shipped in the Spark closure.

    ``sources`` maps the index of each DataFrame the job reads to its name (empty: the stage runs
    over ``spark.range`` and its rows are ignored). Without a ``channel`` (the executors cannot
    reach the notebook) the task keeps its rank's events and returns them with its status.
    """

    payload: bytes
    channel: ChannelAddress | None
    env: dict[str, str] = field(default_factory=dict)
    job_id: str = ""
    sources: dict[int, str] = field(default_factory=dict)
    #: An elastic job: each (non-barrier) task offers one slot and starts its rank when the
    #: driver's elastic driver assigns it (see :mod:`hvd_magics.task.elastic_task`).
    elastic: bool = False
    #: A warm pool: the rank keeps running cells the driver sends as orders
    #: (:mod:`hvd_magics.rank.pool_loop`) until it is told to end.
    pool: bool = False
    #: Per source index, the columns that must hold no nulls and what an error calls each
    #: (:attr:`hvd_magics.launch.dataframe_input.DataFrameSource.no_nulls`).
    no_nulls: dict[int, dict[str, str]] = field(default_factory=dict)


class RankHolder:
    """The rank process of a task, killed when the driver goes away (even before it starts).

    ``pool``: a warm pool's rank, which takes the driver's cell orders (:meth:`on_order`).
    """

    def __init__(self, pool: bool = False) -> None:
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self.proc: RankProcess | None = None
        self.delivered = False
        self.pool = pool
        #: A warm pool's receiver of the shards later cells read.
        self.receiver: ShardReceiver | None = None
        #: How the task meets the others (the driver's ``meet`` order answers it).
        self.meeting = TaskMeeting()

    def on_order(self, order: dict[str, Any]) -> None:
        """Carry out the driver's order: the tasks' meeting, report the rank's stacks; on a
        warm pool also run a cell, interrupt it, end the pool or drop shards."""
        kind = order.get("kind")
        if kind == MEET:
            self.meeting.answer(list(order["gathered"]), BY_DRIVER)
            return
        proc = self.proc
        if proc is None:
            return
        if kind == RUN_CELL:
            proc.send_frame(base64.b64decode(order["frame"]))
        elif kind == TAKE_STACKS:
            proc.request_stacks(str(order.get("request", "")))
        elif kind == INTERRUPT_CELL:
            proc.interrupt()
        elif kind == END_POOL:
            proc.end_input()
        elif kind == DROP_SHARDS and self.receiver is not None:
            with contextlib.suppress(ValueError):  # not a deal id of ours: nothing to drop
                self.receiver.drop(str(order["deal"]))

    def on_driver_gone(self) -> None:
        self.meeting.cancel()
        with self._lock:
            self.stopped.set()
            if self.proc is not None:
                self.proc.kill()

    def start(self, env: dict[str, str], sink: Any) -> None:
        """Start the rank process, which imports what the job needs until :meth:`deliver`."""
        with self._lock:
            if not self.stopped.is_set():
                self.proc = RankProcess(env, None, sink, pool=self.pool)

    def deliver(self, payload: bytes, late_env: dict[str, str]) -> RankProcess | None:
        """Send the rank its job; ``None`` when the job was stopped meanwhile."""
        with self._lock:
            if self.stopped.is_set() or self.proc is None:
                return None
            self.proc.deliver(payload, late_env)
            self.delivered = True
            return self.proc

    def discard(self) -> None:
        """Kill a rank that never got its job (setup failed elsewhere): no exit is reported."""
        with self._lock:
            self.stopped.set()
            if self.proc is not None and not self.delivered:
                self.proc.kill()


class DriverUnreachable(ConnectionError):
    """The task cannot reach the notebook's event channel (the message says what to do)."""


class TaskSetupError(RuntimeError):
    """A barrier task could not get ready to meet the others through the driver (its message
    is the setup error); raised out of the task to fail the stage."""


def _connect(spec: TaskSpec, rank: int, host: str, holder: RankHolder
             ) -> EventClient | EventBuffer:
    """The task's way to the driver: the event channel, or a buffer when there is none."""
    if spec.channel is None:
        return EventBuffer(rank, host, spec.job_id)
    try:
        return EventClient(spec.channel, rank, host, on_close=holder.on_driver_gone,
                           on_order=holder.on_order)
    except OSError as exc:
        raise DriverUnreachable(
            f"the executor on {socket.gethostname()} cannot reach the notebook's event channel "
            f"at {spec.channel.host}:{spec.channel.port} ({type(exc).__name__}: {exc}). Fix: "
            f"set {ENV_DRIVER_HOST} in the notebook to an address of its machine that the "
            f"executors reach, or {ENV_LIVE}=0 to run without a live view (output, errors and "
            "the value come back when the job ends).") from None


def _setup_error(exc: BaseException) -> str:
    """A setup failure as the driver shows it: our own errors as their message, others whole."""
    if isinstance(exc, (ShardSpaceError, DriverUnreachable)):
        return str(exc)
    return traceback.format_exc()


def _shard_env(spec: TaskSpec, slots: list, gathered: list[dict[str, Any]],
               mine: list[ShardFile]) -> dict[str, str]:
    """``HVD_MAGICS_SHARDS``: each source's name, this task's file and every rank's rows."""
    described = []
    for position, shard in enumerate(mine):
        rows_per_rank = [0] * len(slots)
        for task, message in enumerate(gathered):
            rows_per_rank[slots[task].rank] = message["shards"][position]["rows"]
        described.append({"index": shard.source, "name": spec.sources[shard.source],
                          "path": shard.path, "rows_per_rank": rows_per_rank})
    return {ENV_SHARDS: json.dumps(described)} if described else {}


def barrier_task(spec: TaskSpec, rows: Iterator) -> Iterator[str]:
    """The body of one barrier task; yields its status as one JSON line (after its rank's kept
    events, in chunks, when there is no live view)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    partition = ctx.partitionId()
    hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
    host = hosts[partition]
    holder = RankHolder(pool=spec.pool)
    server = client = folder = offer = None
    port = 0
    engine = ENGINE_HOROVOD
    error = ""
    slots: list = []
    shards: list[ShardFile] = []
    try:
        engine = engine_of(spec.env)
        slots = plan_ranks(hosts)
        slot = slots[partition]
        client = _connect(spec, slot.rank, host, holder)
        root_task = next(i for i, s in enumerate(slots) if s.rank == 0)
        # The rank starts now and imports what the job needs while the data arrives and the
        # tasks meet; its rendezvous port and shards follow with the job.
        holder.start(_rank_env(spec, ctx, slot, hosts[root_task], host), client.send)
        if spec.sources:
            client.send(SHARDING, partition=partition, hostname=socket.gethostname())
            folder = shard_folder(spec.job_id, partition, spec.env)
            shards = write_shards(rows, folder, spec.sources)
        elif spec.pool and spec.channel is not None:
            folder = shard_folder(spec.job_id, partition, spec.env)
            holder.receiver = ShardReceiver(folder, spec.channel.secret)
        if engine == ENGINE_HOROVOD and slot.rank == 0:
            server, port = start_rendezvous(slots)
        elif offers_port(engine, slot.rank):
            offer = PortOffer()
            port = offer.port
    except BaseException as exc:  # noqa: BLE001 - reported through allGather, never raised
        error = _setup_error(exc)
    message = {"port": port, "error": error, "shards": [s.as_dict() for s in shards]}
    try:
        if spec.channel is not None and not isinstance(client, EventClient):
            # the others offer to the driver and wait for it: fail the stage, Spark stops them
            raise TaskSetupError(error)
        gathered = holder.meeting.meet(ctx, partition, message, client.send if isinstance(
            client, EventClient) else None)
        if gathered is None:  # the driver went away before the tasks met
            holder.discard()
            yield json.dumps({"rank": slot.rank, "code": None, "stopped": True})
            return
        errors = [g["error"] for g in gathered if g["error"]]
        refused = None
        if not errors and spec.sources:
            refused = empty_shards([[s["rows"] for s in g["shards"]] for g in gathered],
                                   spec.sources) or null_values(
                [s for g in gathered for s in g["shards"]], spec.no_nulls)
        if errors or refused:
            holder.discard()
            yield json.dumps({"partition": partition, "error": errors[0] if errors else refused,
                              "setup": True, **({"refused": True} if refused else {})})
            return
        addresses = [("", 0)] * len(slots)
        for task, message in enumerate(gathered):
            addresses[slots[task].rank] = (hosts[task], message["port"])
        late_env = {**meet_env(engine, slot.rank, addresses),
                    **_shard_env(spec, slots, gathered, shards)}
        if offer is not None:
            offer.release()  # the rank listens on it
        data = [host, holder.receiver.port] if holder.receiver is not None else None
        status = supervise(spec, ctx, slot.rank, slot.local_rank, client, holder, late_env,
                           shards, data)
        if isinstance(client, EventBuffer):  # no channel: the events travel with the result
            for number, chunk in enumerate(client.chunks()):
                yield json.dumps({"partition": partition, "events": chunk, "chunk": number})
        yield json.dumps(status)
    finally:
        holder.discard()  # a no-op for a rank that got its job
        if offer is not None:
            offer.release()
        if server is not None:
            stop_rendezvous(server)
        if client is not None:
            client.close()
        if holder.receiver is not None:
            holder.receiver.close()
        if folder is not None:
            remove_shards(folder)


def task_rank_env(spec: TaskSpec, ctx: Any) -> dict[str, str]:
    """The environment every rank of this task starts with: the job's, and the GPUs Spark gave
    the task (``ctx`` is its ``TaskContext``)."""
    env = rank_environment(dict(os.environ), spec.env)
    env.update(rank_python(spec.env))  # the notebook's environment, when the job ships it
    gpus = ctx.resources().get("gpu")
    if gpus is not None and gpus.addresses:
        env[CUDA_VISIBLE_DEVICES] = visible_devices(gpus.addresses, os.environ)
    return env


def _rank_env(spec: TaskSpec, ctx: Any, slot: Any, root_host: str, host: str) -> dict[str, str]:
    """The rank's environment as far as it is known before the tasks meet."""
    env = task_rank_env(spec, ctx)
    env.update(start_env(engine_of(spec.env), slot, root_host, iface_for_address(host),
                         node_per_task=True))
    return env


def supervise(spec: TaskSpec, ctx: Any, rank: int, local_rank: int,
              client: EventClient | EventBuffer, holder: RankHolder, late_env: dict[str, str],
              shards: list[ShardFile], data: list | None = None) -> dict:
    """Send the waiting rank its job and wait for it to end; return the task's status
    (``data``: where a warm pool's task receives later shards)."""
    try:
        client.send(TASK_STARTED, partition=ctx.partitionId(), hostname=socket.gethostname(),
                    local_rank=local_rank, pid=os.getpid(),
                    shards=[{"name": spec.sources[s.source], **s.as_dict()} for s in shards],
                    met=holder.meeting.by, **({"data": data} if data else {}))
        proc = holder.deliver(spec.payload, late_env)
        if proc is None:
            return {"rank": rank, "code": None, "stopped": True}
        return {"rank": rank, "code": proc.wait()}
    except BaseException:  # noqa: BLE001
        try:
            client.send(TASK_ERROR, traceback=traceback.format_exc())
        except OSError:
            pass
        return {"rank": rank, "error": traceback.format_exc()}
