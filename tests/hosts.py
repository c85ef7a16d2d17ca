"""Real hosts on one machine, for the tests of what crosses a network: each host a Linux network
namespace with its own address on a bridge the test made, its own hostname, ``/etc/hosts`` and
``/tmp``, and one standalone Spark worker inside it; the master and the driver on the bridge
(see ``../shared/notes/several-hosts.md``). Needs root, ``ip`` and ``unshare``.

Everything made here (namespaces, links, processes) is removed by :meth:`HostCluster.stop`, also
after a failed test, and at the latest when the process that made it exits; what a killed
process left (it never exits) is removed by the next cluster made, its owner's pid and start
time being kept in :data:`OWNERS`.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hvd_magics.common.process_group import start_time
from tests.standalone import wait_for_master

#: The /24 the hosts live on is ``10.77.<n>.0`` and the unroutable second network ``10.78.<n>.0``
#: (``n`` from this process's id: two suites side by side get two networks).
PREFIX, SECOND_PREFIX = "10.77", "10.78"
#: Where each cluster's tag names the process that made it (``pid start-time``).
OWNERS = Path("/tmp/hvd-hosts-owners")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclass
class Host:
    """One host: its namespace, name, address, the bridge side of its link, and its folders."""

    namespace: str
    name: str
    address: str
    link: str
    root: Path
    #: Folders under /tmp that must stay visible on the host (the repository and its
    #: environment, when a clone lies there): bound into the host's own /tmp at the same path.
    keep: tuple[str, ...] = ()

    def run(self, *command: str, env: dict[str, str] | None = None,
            log: Path | None = None) -> subprocess.Popen:
        """Start ``command`` on this host: inside its namespace, with its hostname, its
        ``/etc/hosts`` and its own ``/tmp``."""
        keep = "".join(f"mkdir -p \"$2\"{shlex.quote(path[4:])} && mount --bind "
                       f"{shlex.quote(path)} \"$2\"{shlex.quote(path[4:])} && "
                       for path in self.keep)
        inner = (f"hostname \"$0\" && mount --bind \"$1\" /etc/hosts && {keep}"
                 "mount --rbind \"$2\" /tmp && shift 2 && exec \"$@\"")
        out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "--mount",
             "--propagation", "private", "--", "sh", "-c", inner, self.name,
             str(self.root / "hosts"), str(self.root / "tmp"), *command],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def pids(self) -> list[int]:
        """Every process in the host's namespace."""
        out = _ip("netns", "pids", self.namespace, check=False).stdout
        return [int(pid) for pid in out.split()]

    def cut(self) -> None:
        """Cut the host's link (as a pulled cable or a lost machine)."""
        _ip("link", "set", self.link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.link, "up")

    def limit_cpu(self, share: float | None) -> None:
        """Give every process on the host, and every one it starts later, ``share`` of one CPU
        at most (a cgroup's CPU quota, as a container's CPU limit); ``None`` lifts it."""
        group = self.cpu_group()
        if share is None:
            if group.exists():
                for pid in self.pids():
                    with contextlib.suppress(OSError):
                        (group.parent / "cgroup.procs").write_text(str(pid))
                group.rmdir()
            return
        group.mkdir(exist_ok=True)
        period = 100_000
        if (group / "cpu.max").exists():  # cgroup v2
            (group / "cpu.max").write_text(f"{int(share * period)} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(int(share * period)))
        for pid in self.pids():
            with contextlib.suppress(OSError):  # one that ended meanwhile
                (group / "cgroup.procs").write_text(str(pid))

    def cpu_group(self) -> Path:
        """The cgroup :meth:`limit_cpu` puts the host's processes in."""
        v1 = Path("/sys/fs/cgroup/cpu")
        return (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / f"hvd-{self.namespace}"

    def limit(self, rate: str | None) -> None:
        """Limit what the host receives to ``rate`` (``"100mbit"``: a token bucket on its link's
        bridge side); ``None`` lifts the limit."""
        if rate is None:
            subprocess.run(["tc", "qdisc", "del", "dev", self.link, "root"], capture_output=True)
            return
        subprocess.run(["tc", "qdisc", "replace", "dev", self.link, "root", "tbf", "rate", rate,
                        "burst", "32kbit", "latency", "400ms"], check=True, capture_output=True)


def _kept_under_tmp() -> tuple[str, ...]:
    """The folders the hosts run code from that lie under /tmp (a clone there, its venv):
    each host's own /tmp would hide them."""
    roots = {str(Path(__file__).resolve().parents[1]), os.path.realpath(sys.prefix)}
    return tuple(sorted(path for path in roots if path.startswith("/tmp/")
                        and not any(path.startswith(other + "/") for other in roots)))


class HostCluster:
    """A standalone Spark master on a bridge and ``hosts`` hosts of ``cores`` cores, one worker
    each.

    Parameters
    ----------
    hosts, cores : int
        How many hosts, and each worker's cores.
    debian : tuple of int
        Hosts whose ``/etc/hosts`` resolves their own name to ``127.0.1.1``, as Debian and
        Ubuntu write it (the others resolve it to their bridge address).
    second_network : bool
        Give every host a second interface (``eth1``, on a network where the hosts cannot
        reach each other), as a management NIC, and resolve each host's name to it.
    """

    #: Clusters made by this process so far.
    made = 0

    def __init__(self, hosts: int = 2, cores: int = 2, debian: tuple[int, ...] = (),
                 second_network: bool = False) -> None:
        HostCluster.made += 1  # a second cluster of the same process gets names of its own
        self.tag = f"{os.getpid() % 1000}{HostCluster.made % 10}"
        net = 20 + (os.getpid() * 7 + HostCluster.made) % 200
        self.subnet = f"{PREFIX}.{net}"
        self.bridge, self.bridge_address = f"hvb{self.tag}", f"{self.subnet}.1"
        self.base = Path(os.environ.get("TMPDIR", "/tmp")) / f"hvd-hosts-{self.tag}"
        self.hosts: list[Host] = []
        self.procs: list[subprocess.Popen] = []
        #: The second network's bridge and links (``second_network``).
        self.second_bridge = ""
        self.links: list[str] = []
        self.cores = cores
        _remove_what_dead_owners_left()
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.tag).write_text(f"{os.getpid()} {start_time(os.getpid())}")
        atexit.register(self.stop)
        try:
            self._network(hosts, debian, second_network, f"{SECOND_PREFIX}.{net}")
            self._spark()
        except BaseException:
            self.stop()
            raise

    # -- the network -----------------------------------------------------------------------
    def _network(self, count: int, debian: tuple[int, ...], second: bool, second_net: str) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index in range(count):
            name, address = f"host{index + 1}", f"{self.subnet}.{index + 2}"
            namespace, link = f"hvn{self.tag}h{index}", f"hv{self.tag}h{index}"
            root = self.base / name
            (root / "tmp").mkdir(parents=True, exist_ok=True)
            os.chmod(root / "tmp", 0o1777)
            host = Host(namespace, name, address, link, root, _kept_under_tmp())
            self.hosts.append(host)
            _ip("netns", "add", namespace)
            _ip("link", "add", link, "type", "veth", "peer", "name", f"hp{self.tag}h{index}")
            _ip("link", "set", f"hp{self.tag}h{index}", "netns", namespace)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            _ip("-n", namespace, "link", "set", f"hp{self.tag}h{index}", "name", "eth0")
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            own = address
            if second:
                own = f"{second_net}.{index + 2}"
                self._second_link(namespace, index, own)
            if index in debian:
                own = "127.0.1.1"
            (root / "hosts").write_text(f"127.0.0.1 localhost\n{own} {name}\n")

    def _second_link(self, namespace: str, index: int, address: str) -> None:
        """A second interface, ``eth1``, on a network whose ports reach only the driver's side
        (an isolated bridge: the hosts cannot reach each other there), as a management NIC."""
        if not self.second_bridge:
            self.second_bridge = f"hvm{self.tag}"
            _ip("link", "add", self.second_bridge, "type", "bridge")
            _ip("addr", "add", f"{address.rsplit('.', 1)[0]}.1/24", "dev", self.second_bridge)
            _ip("link", "set", self.second_bridge, "up")
        link, peer = f"hv{self.tag}m{index}", f"hq{self.tag}m{index}"
        _ip("link", "add", link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", namespace)
        _ip("link", "set", link, "master", self.second_bridge)
        _ip("link", "set", link, "up")
        subprocess.run(["bridge", "link", "set", "dev", link, "isolated", "on"], check=True,
                       capture_output=True)
        self.links.append(link)
        _ip("-n", namespace, "link", "set", peer, "name", "eth1")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth1")
        _ip("-n", namespace, "link", "set", "eth1", "up")

    # -- Spark -------------------------------------------------------------------------------
    def _spark(self) -> None:
        import pyspark

        home = os.path.dirname(pyspark.__file__)
        self.spark_class = os.path.join(home, "bin", "spark-class")
        env = {key: value for key, value in os.environ.items()
               if key not in ("TMPDIR", "HVD_MAGICS_ZYGOTE_DIR", "SPARK_LOCAL_IP")}
        self.env = {**env, "SPARK_HOME": home, "PYSPARK_PYTHON": sys.executable}
        self.port, self.ui_port = 7077, 8080
        self.url = f"spark://{self.bridge_address}:{self.port}"
        (self.base / "master").mkdir(parents=True, exist_ok=True)
        self.procs.append(self._start_master())
        self._wait(lambda state: True, "the master's web UI")
        for host in self.hosts:
            self.procs.append(host.run(
                self.spark_class, "org.apache.spark.deploy.worker.Worker", self.url,
                "--cores", str(self.cores), "--memory", "2g", "--host", host.address,
                "--work-dir", "/tmp/spark-work", "--webui-port", "8081",
                env={**self.env, "SPARK_LOCAL_IP": host.address, "TMPDIR": "/tmp"},
                log=host.root / "worker.log"))
        self._wait(lambda state: sum(w["state"] == "ALIVE" for w in state["workers"])
                   >= len(self.hosts), f"{len(self.hosts)} workers to register")

    def _start_master(self) -> subprocess.Popen:
        log = open(self.base / "master" / "master.log", "wb")  # noqa: SIM115
        return subprocess.Popen(
            [self.spark_class, "org.apache.spark.deploy.master.Master", "--host",
             self.bridge_address, "--port", str(self.port), "--webui-port", str(self.ui_port)],
            env={**self.env, "SPARK_LOCAL_IP": self.bridge_address}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, ready, what: str, timeout: float = 90) -> None:
        wait_for_master(f"http://{self.bridge_address}:{self.ui_port}/json/", ready, what,
                        self.base, timeout)

    def session_conf(self) -> dict[str, str]:
        """What a SparkSession on these hosts needs: the driver on the bridge, one executor of
        every core per host."""
        return {"spark.driver.host": self.bridge_address,
                "spark.driver.bindAddress": self.bridge_address,
                "spark.executor.cores": str(self.cores),
                "spark.cores.max": str(self.cores * len(self.hosts)),
                "spark.executor.memory": "1g"}

    def stop(self) -> None:
        """Kill every process on the hosts and the master; remove the namespaces and links."""
        for host in self.hosts:
            for pid in host.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        self.procs = []
        for host in self.hosts:
            deadline = time.monotonic() + 10
            while host.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                host.cpu_group().rmdir()
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.link, check=False)
        for link in self.links:
            _ip("link", "del", link, check=False)
        for bridge in (self.bridge, self.second_bridge):
            if bridge:
                _ip("link", "del", bridge, check=False)
        self.hosts, self.links = [], []
        shutil.rmtree(self.base, ignore_errors=True)
        (OWNERS / self.tag).unlink(missing_ok=True)

    def left(self) -> list[str]:
        """What of this cluster is still there (namespaces, links): ``[]`` once stopped."""
        names = _ip("netns", "list", check=False).stdout + _ip("link", "show",
                                                                check=False).stdout
        groups = [str(group) for group in Path("/sys/fs/cgroup").glob(f"**/hvd-hvn{self.tag}*")]
        return sorted({word.rstrip(":").split("@")[0] for word in names.split()
                       if word.startswith((f"hvn{self.tag}", f"hv{self.tag}", f"hvb{self.tag}",
                                           f"hvm{self.tag}"))} | set(groups))


def _owner_alive(tag: str) -> bool:
    """Whether the process that made the cluster tagged ``tag`` still runs (no record: not
    known, taken as alive unless its namespaces hold no process)."""
    try:
        pid, started = (OWNERS / tag).read_text().split()
    except (OSError, ValueError):
        return True
    return start_time(int(pid)) is not None and str(start_time(int(pid))) == started


def _remove_what_dead_owners_left() -> None:
    """Remove the namespaces, links, cgroups and folders of clusters whose maker was killed
    (a run cut off before its ``atexit``): a later cluster of the same tag, or of the same
    subnet, would not start beside them."""
    namespaces = _ip("netns", "list", check=False).stdout.split()
    tags = {name[3:].rsplit("h", 1)[0] for name in namespaces if name.startswith("hvn")}
    tags |= {path.name for path in OWNERS.glob("*")} if OWNERS.is_dir() else set()
    links = [word.rstrip(":").split("@")[0]
             for word in _ip("link", "show", check=False).stdout.split()]
    for tag in sorted(tags):
        if _owner_alive(tag) and (OWNERS / tag).exists():
            continue
        mine = [n for n in namespaces if n.startswith(f"hvn{tag}h")]
        if not (OWNERS / tag).exists() and any(
                _ip("netns", "pids", n, check=False).stdout.split() for n in mine):
            continue  # not known whose, and in use
        for namespace in mine:
            for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", namespace, check=False)
            for group in Path("/sys/fs/cgroup").glob(f"**/hvd-{namespace}"):
                with contextlib.suppress(OSError):
                    group.rmdir()
        for link in links:
            if link.startswith((f"hv{tag}h", f"hp{tag}h", f"hvb{tag}", f"hvm{tag}")):
                _ip("link", "del", link, check=False)
        shutil.rmtree(Path(os.environ.get("TMPDIR", "/tmp")) / f"hvd-hosts-{tag}",
                      ignore_errors=True)
        (OWNERS / tag).unlink(missing_ok=True)
