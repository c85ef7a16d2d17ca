"""Which rank each task gets, and the Horovod Gloo environment of each rank.

Ranks on the same host get contiguous local ranks, hosts in the order in which they first appear
among the tasks (as Horovod's ``get_host_assignments`` plans them; written here so that a Spark
task whose Python has no Horovod, given the notebook's shipped environment, plans them too).
"""
from __future__ import annotations

import ipaddress
import socket
import threading
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence


from hvd_magics.protocol import (ENV_HOROVOD_CONTROLLER, ENV_HOROVOD_CPU_OPERATIONS,
                                 ENV_HOROVOD_CROSS_RANK, ENV_HOROVOD_CROSS_SIZE,
                                 ENV_HOROVOD_GLOO_IFACE, ENV_HOROVOD_HOSTNAME,
                                 ENV_HOROVOD_LOCAL_RANK, ENV_HOROVOD_LOCAL_SIZE, ENV_HOROVOD_RANK,
                                 ENV_HOROVOD_SIZE, ENV_RENDEZVOUS_ADDR, ENV_RENDEZVOUS_PORT)
from hvd_magics.task.rendezvous import RendezvousServer


@dataclass(frozen=True)
class RankSlot:
    """Where one rank is in the job: Horovod's ``SlotInfo``, field for field (its rendezvous
    and elastic driver take it as one)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int

    def to_response_string(self) -> str:
        """As Horovod's elastic rendezvous answers a rank's ``rank_and_size`` question."""
        return ",".join(str(v) for v in (self.rank, self.size, self.local_rank, self.local_size,
                                         self.cross_rank, self.cross_size))


def plan_ranks(task_hosts: Sequence[str]) -> list[RankSlot]:
    """Give every task a rank.

    Parameters
    ----------
    task_hosts : sequence of str
        The host of each task, indexed by task (partition) id.

    Returns
    -------
    list of RankSlot
        ``result[task]`` is that task's slot; ranks are contiguous within a host, and a rank's
        cross rank counts the hosts before its own that have a rank of its local rank.
    """
    order: list[str] = []
    for host in task_hosts:
        if host not in order:
            order.append(host)
    counts = {host: task_hosts.count(host) for host in order}
    by_host: dict[str, list[RankSlot]] = {}
    rank = 0
    for host in order:
        by_host[host] = []
        for local_rank in range(counts[host]):
            crossing = [h for h in order if counts[h] > local_rank]
            by_host[host].append(RankSlot(host, rank, local_rank, crossing.index(host),
                                          len(task_hosts), counts[host], len(crossing)))
            rank += 1
    return [by_host[host].pop(0) for host in task_hosts]


def node_ranks(slots: Sequence[RankSlot]) -> dict[str, int]:
    """Each host's node rank: the hosts in the order of their first rank (rank 0's host is
    node 0), as torchrun numbers its nodes (``GROUP_RANK``)."""
    order: dict[str, int] = {}
    for slot in sorted(slots, key=lambda s: s.rank):
        order.setdefault(slot.hostname, len(order))
    return order


def slot_env(slot, rendezvous_host: str, rendezvous_port: int, iface: str = "") -> dict[str, str]:
    """The environment ``hvd.init()`` reads to join a Gloo job as ``slot``."""
    return {
        ENV_HOROVOD_HOSTNAME: slot.hostname,
        ENV_HOROVOD_RANK: str(slot.rank),
        ENV_HOROVOD_SIZE: str(slot.size),
        ENV_HOROVOD_LOCAL_RANK: str(slot.local_rank),
        ENV_HOROVOD_LOCAL_SIZE: str(slot.local_size),
        ENV_HOROVOD_CROSS_RANK: str(slot.cross_rank),
        ENV_HOROVOD_CROSS_SIZE: str(slot.cross_size),
        ENV_RENDEZVOUS_ADDR: rendezvous_host,
        ENV_RENDEZVOUS_PORT: str(rendezvous_port),
        ENV_HOROVOD_CONTROLLER: "gloo",
        ENV_HOROVOD_CPU_OPERATIONS: "gloo",
        ENV_HOROVOD_GLOO_IFACE: iface,
    }


def _interface_addresses() -> list[tuple[str, str]]:
    """``(interface, address)`` for every address of this host (IPv4 only on an executor
    without psutil: hvd_magics travels to executors that lack it)."""
    try:
        import psutil
    except ImportError:
        return _ipv4_addresses()
    return [(name, addr.address.split("%")[0])
            for name, addrs in psutil.net_if_addrs().items() for addr in addrs]


def _ipv4_addresses() -> list[tuple[str, str]]:
    """``(interface, IPv4 address)`` of each interface, asked of the kernel (``SIOCGIFADDR``)."""
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:  # an interface without an IPv4 address
                continue
            found.append((name, socket.inet_ntoa(answer[20:24])))
    return found


def local_addresses() -> set[str]:
    """Every name and address by which this host may appear as a rank's host."""
    return {"localhost", socket.gethostname()} | {a for _, a in _interface_addresses()}


def iface_for_address(host: str) -> str:
    """The name of the local network interface that holds ``host`` (an IP), or ``""``."""
    try:
        wanted = ipaddress.ip_address(host)
    except ValueError:
        return ""
    if wanted.is_loopback:
        wanted = ipaddress.ip_address("127.0.0.1")
    for name, address in _interface_addresses():
        try:
            if ipaddress.ip_address(address) == wanted:
                return name
        except ValueError:
            continue
    return ""


def stop_rendezvous(server: RendezvousServer) -> None:
    """Stop a rendezvous server without waiting: its ``shutdown`` waits out the half-second
    poll of ``serve_forever``, which would otherwise end every job half a second later."""
    threading.Thread(target=server.stop, name="hvd-rendezvous-stop", daemon=True).start()


def start_rendezvous(slots: Sequence[RankSlot]) -> tuple[RendezvousServer, int]:
    """Start a fresh Gloo rendezvous for one fixed-size Horovod job; return ``(server, port)``."""
    server = RendezvousServer(slots)
    return server, server.port


def quiet_request_errors(server: Any, log: Callable[[str], None] | None = None) -> None:
    """A request that fails on a started Horovod rendezvous ``server`` (a rank killed while it
    talked to it) becomes one line for ``log`` (dropped without one), not the traceback
    ``socketserver`` prints to stderr, which a notebook shows in the cell. The rank's own exit
    says what happened."""
    import sys

    def handle_error(_request: object, client_address: object) -> None:
        if log is not None:
            log(f"rendezvous request from {client_address} failed: "
                f"{type(sys.exc_info()[1]).__name__}: {sys.exc_info()[1]}")

    server._httpd.handle_error = handle_error  # noqa: SLF001 - Horovod keeps it private
