"""What runs inside each Spark task of an elastic job (``np=MIN:MAX``).

The tasks form an ordinary (not barrier) stage of ``MAX`` tasks: each one that runs offers one
slot to the notebook's elastic driver over the event channel, starts a rank process that imports
what the job needs, and waits. When the driver assigns the slot a rank it sends the order
``start_rank`` with the rank's Horovod environment; the task hands the rank its job and
supervises it to its end. A task the driver never needs ends when the driver closes the channel.

Each task attempt is one host of Horovod's elastic driver, with one slot (as in
``horovod.spark.run_elastic``): when Spark runs a lost task again on a new executor, that attempt
is a new host, and the job grows back at its next commit.
"""
from __future__ import annotations

import queue
import socket
import traceback
from collections.abc import Iterator

from hvd_magics.channel import EventClient
from hvd_magics.events import Order, SlotOfferEvent, StartRankOrder
from hvd_magics.protocol import (ENV_HOROVOD_GLOO_IFACE, ENV_HOROVOD_HOSTNAME, SLOT_OFFER,
                                 START_RANK)
from hvd_magics.task.slots import iface_for_address
from hvd_magics.task.spark_task import (DriverUnreachable, RankHolder, TaskSpec, supervise,
                                        task_rank_env)

#: Seconds between two looks at whether the driver went away while the task waits for an order.
ORDER_POLL_S = 0.2


def slot_host_prefix(address: str) -> str:
    """How the names of the task attempts on the host ``address`` begin (no ``:``, which
    Horovod's rendezvous keys use as a separator)."""
    return f"{address.replace(':', '_')}-task"


def slot_host_name(address: str, partition: int, attempt: int) -> str:
    """The name Horovod's elastic driver knows a task attempt by."""
    return f"{slot_host_prefix(address)}{partition}-try{attempt}"


def elastic_task(spec: TaskSpec, rows: Iterator) -> Iterator[str]:
    """The body of one task of an elastic job; yields its status as one JSON line."""
    import json

    from pyspark import TaskContext

    ctx = TaskContext.get()  # rows: spark.range's, read by task_entry once the task ends
    partition, attempt = ctx.partitionId(), ctx.attemptNumber()
    holder = RankHolder()
    orders: queue.Queue[Order] = queue.Queue()
    client: EventClient | None = None
    try:
        assert spec.channel is not None  # an elastic job runs only over its event channel
        try:
            client = EventClient(spec.channel, partition, None, on_close=holder.on_driver_gone,
                                 on_order=orders.put)
        except OSError as exc:
            raise DriverUnreachable(
                f"the executor on {socket.gethostname()} cannot reach the notebook's event "
                f"channel at {spec.channel.host}:{spec.channel.port} ({exc}); an elastic job "
                "needs it to hand out ranks") from None
        slot_host = slot_host_name(client.local_address, partition, attempt)
        env = task_rank_env(spec, ctx)
        env.update({ENV_HOROVOD_HOSTNAME: slot_host,
                    ENV_HOROVOD_GLOO_IFACE: iface_for_address(client.local_address)})
        holder.start(env, client.send)
        client.send(SlotOfferEvent(kind=SLOT_OFFER, partition=partition, attempt=attempt,
                                   slot_host=slot_host, hostname=socket.gethostname()))
        order = _wait_for_order(orders, holder)
        if order is None:
            status = {"partition": partition, "code": None, "stopped": True}
        else:
            late_env = {str(k): str(v) for k, v in order.get("env", {}).items()}
            status = supervise(spec, ctx, partition, 0, client, holder, late_env, [])
    except BaseException as exc:  # noqa: BLE001 - returned to the driver, never raised
        detail = str(exc) if isinstance(exc, DriverUnreachable) else traceback.format_exc()
        status = {"partition": partition, "error": detail, "setup": True}
    finally:
        holder.discard()
        if client is not None:
            client.close()
    yield json.dumps(status)


def _wait_for_order(orders: queue.Queue[Order], holder: RankHolder) -> StartRankOrder | None:
    """The driver's ``start_rank`` order, or ``None`` once the driver closed the channel."""
    while not holder.stopped.is_set():
        try:
            order = orders.get(timeout=ORDER_POLL_S)
        except queue.Empty:
            continue
        if order["kind"] == START_RANK:
            return order
    return None
