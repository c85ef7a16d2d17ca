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
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from hvd_magics.channel import ChannelAddress, EventClient
from hvd_magics.events import (Event, MeetMessage, Order, ShardingEvent, ShardReport,
                               TaskErrorEvent, TaskStartedEvent)
from hvd_magics.protocol import (CUDA_VISIBLE_DEVICES, DROP_SHARDS, END_POOL, ENV_DRIVER_HOST,
                                 ENGINE_HOROVOD, ENV_LIVE, ENV_SHARDS, INTERRUPT_CELL, MEET,
                                 PREEMPT, RUN_CELL, SHARDING, TAKE_STACKS, TASK_ERROR,
                                 TASK_STARTED)
from hvd_magics.task.engines import PortOffer, engine_of, meet_env, offers_port, start_env
from hvd_magics.task.event_buffer import EventBuffer
from hvd_magics.task.gpus import rank_devices, task_share, visible_devices
from hvd_magics.task.shard_files import (ShardFile, ShardSpaceError, empty_shards, null_values,
                                         remove_shards, shard_folder, split_shards, write_shards)
from hvd_magics.task.shard_receiver import ShardReceiver
from hvd_magics.task.shipped_environment import ShippedEnvironmentUnusable, rank_python
from hvd_magics.task.supervisor import RankProcess, rank_environment
from hvd_magics.task.threads import task_cpus, with_thread_share
from hvd_magics.task.task_meeting import BY_DRIVER, TaskMeeting, meet
from hvd_magics.task.slots import (iface_for_address, node_ranks, plan_ranks, start_rendezvous,
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
    #: The ranks each task runs (its own process, event connection and shards each): the stage
    #: has ``np / ranks_per_task`` tasks, and a task's ranks are numbered together.
    ranks_per_task: int = 1


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

    def on_order(self, order: Order) -> None:
        """Carry out the driver's order: the tasks' meeting, report the rank's stacks, pass on a
        preemption notice; on a warm pool also run a cell, interrupt it, end the pool or drop
        shards."""
        if order["kind"] == MEET:
            self.meeting.answer(list(order["gathered"]), BY_DRIVER)
            return
        proc = self.proc
        if proc is None:
            return
        if order["kind"] == RUN_CELL:
            proc.send_frame(base64.b64decode(order["frame"]))
        elif order["kind"] == TAKE_STACKS:
            proc.request_stacks(str(order.get("request", "")))
        elif order["kind"] == PREEMPT:
            proc.preempt(int(order["at"]), str(order.get("notice", "")))
        elif order["kind"] == INTERRUPT_CELL:
            proc.interrupt()
        elif order["kind"] == END_POOL:
            proc.end_input()
        elif order["kind"] == DROP_SHARDS and self.receiver is not None:
            with contextlib.suppress(ValueError):  # not a deal id of ours: nothing to drop
                self.receiver.drop(str(order["deal"]))

    def on_driver_gone(self, why: str = "the notebook closed the event channel") -> None:
        """The connection from the driver ended (``why``): the rank is killed, and its exit
        says so (the driver, if it is still there, must not take it for the rank's fault)."""
        self.meeting.cancel()
        with self._lock:
            self.stopped.set()
            if self.proc is not None:
                self.proc.kill(f"killed by its task, which lost the notebook: {why}")

    def start(self, env: dict[str, str], sink: Callable[[Event], None]) -> None:
        """Start the rank process, which imports what the job needs until :meth:`deliver`.

        Not under the lock: a rank whose zygote is still importing waits for it, and the
        driver going away meanwhile must not wait with it (the rank is killed once started).
        In the calling thread, which outlives the rank: a fresh rank's keeper dies with the
        thread that started it (``PR_SET_PDEATHSIG``)."""
        if self.stopped.is_set():
            return
        proc = RankProcess(env, None, sink, pool=self.pool)
        with self._lock:
            self.proc = proc
            if self.stopped.is_set():  # stopped while it started
                proc.kill()

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
    if isinstance(exc, (ShardSpaceError, DriverUnreachable, ShippedEnvironmentUnusable)):
        return str(exc)
    return traceback.format_exc()


def _shard_env(spec: TaskSpec, slots: list, gathered: list[MeetMessage],
               mine: list[ShardFile]) -> dict[str, str]:
    """``HVD_MAGICS_SHARDS``: each source's name, this rank's file and every rank's rows."""
    described = []
    for position, shard in enumerate(mine):
        rows_per_rank = [0] * len(slots)
        for lane, message in enumerate(gathered):
            rows_per_rank[slots[lane].rank] = message["shards"][position]["rows"]
        described.append({"index": shard.source, "name": spec.sources[shard.source],
                          "path": shard.path, "rows_per_rank": rows_per_rank})
    return {ENV_SHARDS: json.dumps(described)} if described else {}


@dataclass
class RankLane:
    """One rank of a barrier task (a task runs ``ranks_per_task`` of them): where it is in the
    job, its process, its own way to the driver and what it offers when the tasks meet.

    ``position`` numbers the job's ranks task by task (``task * ranks_per_task + lane``); the
    meeting's messages, the planned slots and the ranks' hosts are indexed by it.
    """

    position: int
    slot: Any
    holder: RankHolder
    client: EventClient | EventBuffer | None = None
    port: int = 0
    offer: PortOffer | None = None
    server: Any = None
    shards: list[ShardFile] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    #: A warm pool's rank: the folder its receiver keeps later shards in.
    folder: Path | None = None

    def message(self, error: str) -> MeetMessage:
        """What this rank offers the others when the tasks meet."""
        return MeetMessage(port=self.port, error=error, gpus=self.gpus,
                           shards=[s.as_dict() for s in self.shards])

    def close(self) -> None:
        """Free what the rank's task side held (its rank was killed or ended before)."""
        self.holder.discard()  # a no-op for a rank that got its job
        if self.offer is not None:
            self.offer.release()
        if self.server is not None:
            stop_rendezvous(self.server)
        if self.client is not None:
            self.client.close()
        if self.holder.receiver is not None:
            self.holder.receiver.close()
        if self.folder is not None:
            remove_shards(self.folder)


def barrier_task(spec: TaskSpec, rows: Iterator) -> Iterator[str]:
    """The body of one barrier task; yields each of its ranks' status as one JSON line (after
    that rank's kept events, in chunks, when there is no live view)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    task = _BarrierTask.of(spec, ctx)
    try:
        _start_ranks(spec, ctx, task)
        _take_shards(spec, task, rows)
        _offer_ports(task)
    except BaseException as exc:  # noqa: BLE001 - reported through the meeting, never raised
        task.error = _setup_error(exc)
    try:
        gathered = _meet_the_others(spec, ctx, task)
        if gathered is None:  # the driver went away before the tasks met
            for lane in task.lanes:
                lane.holder.discard()
                yield json.dumps({"rank": lane.slot.rank if lane.slot else lane.position,
                                  "code": None, "stopped": True})
            return
        errors = [g["error"] for g in gathered if g["error"]]
        refused = None
        if not errors and spec.sources:
            refused = empty_shards([[s["rows"] for s in g["shards"]] for g in gathered],
                                   spec.sources) or null_values(
                [s for g in gathered for s in g["shards"]], spec.no_nulls)
        if errors or refused:
            for lane in task.lanes:
                lane.holder.discard()
            yield json.dumps({"partition": task.partition,
                              "error": errors[0] if errors else refused,
                              "setup": True, **({"refused": True} if refused else {})})
            return
        yield from _run_lanes(spec, ctx, task.engine, task.lanes, task.hosts, task.slots,
                              gathered)
    finally:
        for lane in task.lanes:
            lane.close()
        if task.folder is not None:
            remove_shards(task.folder)


@dataclass
class _BarrierTask:
    """Where one barrier task stands as its setup goes on (a setup that failed part way leaves
    what it had done, for the task to free): its partition and host, each rank's host and lane
    (by position), the job's engine and planned slots, the folder of its shards, and the setup
    error its ranks offer the others (``""``: none)."""

    partition: int
    host: str
    hosts: list[str]
    lanes: list[RankLane]
    engine: str = ENGINE_HOROVOD
    slots: list = field(default_factory=list)
    folder: Path | None = None
    error: str = ""

    @classmethod
    def of(cls, spec: TaskSpec, ctx: Any) -> _BarrierTask:
        """The task ``ctx`` runs, its ranks not started yet."""
        partition = ctx.partitionId()
        per_task = max(spec.ranks_per_task, 1)
        task_hosts = [info.address.rsplit(":", 1)[0] for info in ctx.getTaskInfos()]
        hosts = [h for h in task_hosts for _ in range(per_task)]  # each rank's, by position
        lanes = [RankLane(partition * per_task + i, None, RankHolder(pool=spec.pool))
                 for i in range(per_task)]
        return cls(partition, task_hosts[partition], hosts, lanes)


def _start_ranks(spec: TaskSpec, ctx: Any, task: _BarrierTask) -> None:
    """Plan the job's ranks, connect each of this task's to the driver and start its process.

    The rank starts now and imports what the job needs while the data arrives and the tasks
    meet; its rendezvous port, shards and its host's GPUs (when other tasks share the host)
    follow with the job."""
    lanes, hosts, host = task.lanes, task.hosts, task.host
    task.engine = engine_of(spec.env)
    task.slots = plan_ranks(hosts)
    task_env = task_rank_env(spec, ctx, len(lanes))
    addresses = _task_gpus(ctx)
    shares = [task_share(addresses, len(lanes), i) for i in range(len(lanes))]
    root = next(p for p, s in enumerate(task.slots) if s.rank == 0)
    nodes = node_ranks(task.slots)
    iface = iface_for_address(host)
    for i, lane in enumerate(lanes):
        lane.slot, lane.gpus = task.slots[lane.position], shares[i]
        lane.client = _connect(spec, lane.slot.rank, host, lane.holder)
        env = {**task_env, **start_env(task.engine, lane.slot, hosts[root], iface, nodes[host],
                                       len(nodes))}
        devices = rank_devices(task.engine, shares, i)
        if devices is not None:
            env[CUDA_VISIBLE_DEVICES] = devices
        lane.holder.start(env, lane.client.send)


def _take_shards(spec: TaskSpec, task: _BarrierTask, rows: Iterator) -> None:
    """Write the task's rows as its ranks' shards of the job's DataFrames; a warm pool's ranks
    instead get a receiver of the shards later cells read."""
    lanes = task.lanes
    if spec.sources:
        assert lanes[0].client is not None  # every lane connected in _start_ranks
        lanes[0].client.send(ShardingEvent(kind=SHARDING, partition=task.partition,
                                           hostname=socket.gethostname()))
        task.folder = shard_folder(spec.job_id, task.partition, spec.env)
        written = write_shards(rows, task.folder, spec.sources)
        for lane, shards in zip(lanes, split_shards(written, len(lanes), spec.sources)):
            lane.shards = shards
    elif spec.pool and spec.channel is not None:
        for lane in lanes:
            lane.folder = shard_folder(spec.job_id, lane.position, spec.env)
            lane.holder.receiver = ShardReceiver(lane.folder, spec.channel.secret)


def _offer_ports(task: _BarrierTask) -> None:
    """The port each rank offers the others: Horovod's rendezvous on rank 0, or the port the
    engine's ranks listen on."""
    for lane in task.lanes:
        if task.engine == ENGINE_HOROVOD and lane.slot.rank == 0:
            lane.server, lane.port = start_rendezvous(task.slots)
        elif offers_port(task.engine, lane.slot.rank):
            lane.offer = PortOffer()
            lane.port = lane.offer.port


def _meet_the_others(spec: TaskSpec, ctx: Any, task: _BarrierTask
                     ) -> list[MeetMessage] | None:
    """Offer each rank's message (its port, shards, GPUs and the setup error) and gather every
    rank's; ``None`` when the driver went away before the tasks met.

    Raises
    ------
    TaskSetupError
        When the task has a channel but could not connect every rank to it: the others offer
        to the driver and wait for it, so the stage must fail (Spark stops them).
    """
    lanes = task.lanes
    if spec.channel is not None and not all(isinstance(lane.client, EventClient)
                                            for lane in lanes):
        raise TaskSetupError(task.error)
    # with a channel, every lane's client is an EventClient (checked above): none left out
    sends: list[Callable[[Event], None]] | None = (
        [lane.client.send for lane in lanes if lane.client is not None]
        if spec.channel is not None else None)
    meet(ctx, [(lane.holder.meeting, lane.position, lane.message(task.error)) for lane in lanes],
         sends)
    return lanes[0].holder.meeting.wait()


def _task_gpus(ctx: Any) -> list[str]:
    """The GPUs Spark gave the task, as this executor's CUDA names them."""
    gpus = ctx.resources().get("gpu")
    if gpus is None or not gpus.addresses:
        return []
    return visible_devices(gpus.addresses, os.environ).split(",")


def _late_env(spec: TaskSpec, engine: str, lane: RankLane, hosts: list[str], slots: list,
              gathered: list[MeetMessage]) -> dict[str, str]:
    """What a rank learns once the tasks met: its peers' ports, its shards, the GPUs of its
    host's ranks in local-rank order."""
    addresses = [("", 0)] * len(slots)
    host_gpus: list[list[str]] = [[] for _ in range(lane.slot.local_size)]
    for position, message in enumerate(gathered):
        addresses[slots[position].rank] = (hosts[position], message["port"])
        if hosts[position] == hosts[lane.position]:
            host_gpus[slots[position].local_rank] = list(message.get("gpus", []))
    env = {**meet_env(engine, lane.slot.rank, addresses),
           **_shard_env(spec, slots, gathered, lane.shards)}
    devices = rank_devices(engine, host_gpus, lane.slot.local_rank)
    if devices is not None:
        env[CUDA_VISIBLE_DEVICES] = devices
    return env


def _run_lanes(spec: TaskSpec, ctx: Any, engine: str, lanes: list[RankLane], hosts: list[str],
               slots: list, gathered: list[MeetMessage]) -> Iterator[str]:
    """Give each rank of ``engine`` its job and wait for all of them; yield their status lines
    (each rank's kept events before its status, when there is no live view)."""
    statuses: list[dict | None] = [None] * len(lanes)

    def run(i: int, lane: RankLane) -> None:
        if lane.offer is not None:
            lane.offer.release()  # the rank listens on it
        data = ([hosts[lane.position], lane.holder.receiver.port]
                if lane.holder.receiver is not None else None)
        assert lane.client is not None  # connected in the setup, which every task passed
        statuses[i] = supervise(spec, ctx, lane.slot.rank, lane.slot.local_rank, lane.client,
                                lane.holder, _late_env(spec, engine, lane, hosts, slots, gathered),
                                lane.shards, data)

    threads = [threading.Thread(target=run, args=(i, lane), name=f"hvd-rank-{lane.slot.rank}",
                                daemon=True) for i, lane in enumerate(lanes[1:], 1)]
    for thread in threads:
        thread.start()
    run(0, lanes[0])
    for thread in threads:
        thread.join()
    for lane, status in zip(lanes, statuses):
        if isinstance(lane.client, EventBuffer):  # no channel: the events travel with the result
            for number, chunk in enumerate(lane.client.chunks()):
                yield json.dumps({"partition": lane.position, "events": chunk, "chunk": number})
        yield json.dumps(status)


def task_rank_env(spec: TaskSpec, ctx: Any, ranks: int = 1) -> dict[str, str]:
    """The environment every one of the ``ranks`` ranks of this task starts with: the job's, its
    share of the task's CPUs and the GPUs Spark gave the task (``ctx`` is its ``TaskContext``)."""
    base = with_thread_share(os.environ, spec.env, task_cpus(ctx), ranks, keep_base=False)
    env = rank_environment(base, spec.env)
    env.update(rank_python(spec.env))  # the notebook's environment, when the job ships it
    gpus = _task_gpus(ctx)
    if gpus:
        env[CUDA_VISIBLE_DEVICES] = ",".join(gpus)
    return env


def supervise(spec: TaskSpec, ctx: Any, rank: int, local_rank: int,
              client: EventClient | EventBuffer, holder: RankHolder, late_env: dict[str, str],
              shards: list[ShardFile], data: list | None = None) -> dict:
    """Send the waiting rank its job and wait for it to end; return the task's status
    (``data``: where a warm pool's task receives later shards)."""
    try:
        started = TaskStartedEvent(
            kind=TASK_STARTED, partition=ctx.partitionId(), hostname=socket.gethostname(),
            local_rank=local_rank, pid=os.getpid(), task=ctx.taskAttemptId(),
            shards=[ShardReport(name=spec.sources[s.source], **s.as_dict()) for s in shards],
            met=holder.meeting.by)
        if data:
            started["data"] = data
        client.send(started)
        proc = holder.deliver(spec.payload, late_env)
        if proc is None:
            return {"rank": rank, "code": None, "stopped": True}
        return {"rank": rank, "code": proc.wait()}
    except BaseException:  # noqa: BLE001
        try:
            client.send(TaskErrorEvent(kind=TASK_ERROR, traceback=traceback.format_exc()))
        except OSError:
            pass
        return {"rank": rank, "error": traceback.format_exc()}
