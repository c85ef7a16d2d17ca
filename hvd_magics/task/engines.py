"""How the ranks of each engine find each other: the environment a rank starts with, the ports
that are offered before the tasks meet, and what each rank learns once they met.

=========  ================================  ==============================================
engine     offered before the tasks meet     learnt once they met
=========  ================================  ==============================================
horovod    rank 0: its Gloo rendezvous       ``HOROVOD_GLOO_RENDEZVOUS_PORT``
torch      rank 0: a free port (the store)   ``MASTER_PORT`` (``MASTER_ADDR`` is known before)
tf         every rank: a free port           ``TF_CONFIG`` naming every worker, and this one
=========  ================================  ==============================================

``torch.distributed.init_process_group()`` then reads what torchrun would set (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``);
``tf.distribute.MultiWorkerMirroredStrategy()`` reads ``TF_CONFIG``. A port is held open until
just before the rank gets its job, so no other process takes it meanwhile.
"""
from __future__ import annotations

import json
import random
import socket
from typing import Any
from collections.abc import Mapping, Sequence

from hvd_magics.protocol import (ENGINE_HOROVOD, ENGINE_TF, ENGINE_TORCH, ENGINES, ENV_ENGINE,
                                 ENV_GLOO_SOCKET_IFNAME, ENV_GROUP_RANK, ENV_GROUP_WORLD_SIZE,
                                 ENV_HOST_RANK, ENV_LOCAL_RANK, ENV_NODE_RANK, ENV_RANK_HOST,
                                 ENV_LOCAL_WORLD_SIZE, ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_RANK,
                                 ENV_RENDEZVOUS_PORT, ENV_SIZE, ENV_TF_CONFIG, ENV_TORCH_RANK,
                                 ENV_WORLD_SIZE)
from hvd_magics.task.slots import slot_env


def engine_of(env: Mapping[str, str]) -> str:
    """The engine a job's environment names (Horovod when it names none)."""
    engine = env.get(ENV_ENGINE, ENGINE_HOROVOD)
    if engine not in ENGINES:
        raise ValueError(f"{ENV_ENGINE}={engine!r} is not an engine; use one of {ENGINES}")
    return engine


def start_env(engine: str, slot: Any, root_host: str, iface: str, node_rank: int = 0,
              nodes: int = 1) -> dict[str, str]:
    """The environment a rank of ``engine`` starts with, as ``slot`` (a Horovod ``SlotInfo``)
    on node ``node_rank`` of ``nodes`` (hosts, numbered as :func:`~hvd_magics.task.slots.
    node_ranks` does).

    Every engine is told the truth about the rank's host: the ranks that share it, whether they
    are one Spark task's or several tasks' (Horovod's local and cross ranks, torchrun's
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``), so that NCCL's paths within a node,
    hierarchical allreduce and hybrid sharding plan with the real topology.
    """
    env = {ENV_ENGINE: engine, ENV_RANK: str(slot.rank), ENV_SIZE: str(slot.size),
           ENV_RANK_HOST: str(slot.hostname), ENV_HOST_RANK: str(slot.local_rank)}
    if engine == ENGINE_HOROVOD:
        env.update(slot_env(slot, root_host, 0, iface))
    elif engine == ENGINE_TORCH:
        env.update({ENV_MASTER_ADDR: root_host, ENV_TORCH_RANK: str(slot.rank),
                    ENV_WORLD_SIZE: str(slot.size), ENV_LOCAL_RANK: str(slot.local_rank),
                    ENV_LOCAL_WORLD_SIZE: str(slot.local_size),
                    ENV_GROUP_RANK: str(node_rank), ENV_NODE_RANK: str(node_rank),
                    ENV_GROUP_WORLD_SIZE: str(nodes)})
        if iface:  # Gloo's own interface choice can pick one the other hosts cannot reach
            env[ENV_GLOO_SOCKET_IFNAME] = iface
    return env


def offers_port(engine: str, rank: int) -> bool:
    """Whether the rank ``rank`` offers a port of its own before the tasks meet (a Horovod
    job's rank 0 starts its rendezvous server instead)."""
    return engine == ENGINE_TF or (engine == ENGINE_TORCH and rank == 0)


#: Where a port is offered from when the host's ephemeral range is not known: below Linux's
#: default one (32768-60999).
OFFERED_PORTS = (20000, 32767)


def offered_ports() -> tuple[int, int]:
    """The ports to offer from: below the host's ephemeral range, which the system hands out
    as the local ports of outgoing connections. A port offered from that range (``bind`` to 0)
    was taken in the moment between its release and the rank's listening by another process's
    connection (TensorFlow: "Could not start gRPC server", seen under the suite's two lanes)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            low = int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return OFFERED_PORTS
    return (OFFERED_PORTS[0], low - 1) if low > OFFERED_PORTS[0] + 1000 else (0, 0)  # 0: any


class PortOffer:
    """A free TCP port on this host, held (bound, not listening) until :meth:`release`: one
    outside the host's ephemeral range when one is free there (:func:`offered_ports`)."""

    def __init__(self) -> None:
        # without SO_REUSEADDR: with it on two offers' sockets, both bound one port (neither
        # listens), and two ranks of a tf job were given it; one bound and never connected
        # leaves no TIME_WAIT for the rank's listener to wait out
        self._sock: socket.socket | None = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        low, high = offered_ports()
        for port in random.sample(range(low, high + 1), min(50, high - low + 1)):
            try:
                self._sock.bind(("", port))
                break
            except OSError:
                continue
        else:
            self._sock.bind(("", 0))
        self.port: int = self._sock.getsockname()[1]

    def release(self) -> None:
        """Free the port for the rank that will listen on it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def meet_env(engine: str, rank: int, addresses: Sequence[tuple[str, int]]) -> dict[str, str]:
    """What rank ``rank`` learns once the tasks met; ``addresses[r]`` is rank ``r``'s host and
    the port it offered (``0``: none)."""
    if engine == ENGINE_HOROVOD:
        return {ENV_RENDEZVOUS_PORT: str(addresses[0][1])}
    if engine == ENGINE_TORCH:
        return {ENV_MASTER_PORT: str(addresses[0][1])}
    workers = [f"{_url_host(host)}:{port}" for host, port in addresses]
    return {ENV_TF_CONFIG: json.dumps({"cluster": {"worker": workers},
                                       "task": {"type": "worker", "index": rank}})}


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
