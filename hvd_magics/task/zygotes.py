"""Start ranks from zygotes: processes that imported the job's frameworks once (the owner side).

A process that starts ranks (a notebook's kernel for ``np < 0``, a Spark Python worker for a
task) asks this host's zygote of the rank's environment (:mod:`hvd_magics.rank.zygote`) for each
rank; one that is ready forks it in milliseconds. A zygote serves every process of its user on
the host (every kernel, every Spark application's workers, a Connect server's), at a socket in
the user's own folder (:mod:`hvd_magics.common.zygote_place`), and outlives the process that
started it until it has been idle ``HVD_MAGICS_ZYGOTE_IDLE_S`` (600 s). The first rank of an
environment no zygote serves starts one when its job's leading imports name frameworks, and the
job's ranks wait for it and fork: one import for the job, not one per rank. A rank without a
zygote (its job names no framework up front, zygotes are off, or one hung) starts as a fresh
interpreter, as it always did; the frameworks its ranks said they imported at their end start
(or grow) the zygote of that environment for the next jobs.

Ranks whose environments differ only in :data:`~hvd_magics.protocol.ZYGOTE_LATE_ENV` (their
rank, their rendezvous, their GPU, Spark's per-application variables) share a zygote; any other
difference (another Python, ``PYTHONPATH``, ``TF_USE_LEGACY_KERAS``, ``OMP_NUM_THREADS``, another
control group: another container) gets a zygote of its own. ``HVD_MAGICS_ZYGOTE=0`` starts every
rank fresh. The package's zip that travelled to an executor (each executor, and each Spark
application, keeps it in a folder of its own) is put on its ranks' ``PYTHONPATH`` as a copy in the
zygotes' folder named by its content (:func:`package_copy`), so that the executors of a host share
a zygote, and none is left importing from a folder that went with its application.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import select
import socket
import subprocess
import sys
import threading
import time
from typing import IO

from hvd_magics.protocol import (ENV_YARN_CONTAINER, ENV_ZYGOTE, ENV_ZYGOTE_IDLE_S,
                                 ENV_ZYGOTE_IMPORTS, ENV_ZYGOTE_LOCK_FD, ENV_ZYGOTE_SOCKET,
                                 KEEPER_PARENT_GONE, KEEPER_STOPPED, KEEPER_TERMINATED,
                                 ZYGOTE_GROW, ZYGOTE_LATE_ENV, ZYGOTE_LATE_ENV_PREFIXES,
                                 ZYGOTE_MODULE, ZYGOTE_MODULES, ZYGOTE_READY)
from hvd_magics.common.zygote_place import (cuda_mark, socket_path, starter_cpu, starting,
                                          take_lock, zygote_dir)

#: Seconds a supervisor waits for a zygote to fork a keeper (a zygote alive answers in
#: milliseconds); past it, the rank starts fresh.
FORK_WAIT_S = 10.0
#: Seconds a rank waits for its environment's zygote while another process starts it (its
#: imports under way) before it starts fresh: forked from it once it serves, the rank skips
#: those imports, and is no later than a fresh rank importing the same ones beside it would be.
STARTING_WAIT_S = 20.0
#: Past :data:`STARTING_WAIT_S`, a rank waits on while the zygote's imports still use CPU (it
#: is slow, not hung: a host whose cores are all busy, 16 zygotes importing PyTorch on 2 cores),
#: up to this many seconds in all: ranks that started fresh instead would each import the same
#: beside it, a host's memory and CPU times its ranks (at 64 ranks on 16 hosts of this machine
#: the fresh imports ran it out of memory).
STARTING_MOST_S = 180.0
#: A zygote whose imports used no CPU for this long is taken for hung.
STARTING_STILL_S = 10.0
#: How often a waiting rank looks whether that zygote serves yet, seconds.
STARTING_POLL_S = 0.05
#: Seconds a process waits for a zygote to greet it once connected; past it, the zygote is taken
#: for hung: its socket is removed (a new one is started for the next job) and ranks start fresh.
GREETING_WAIT_S = 5.0

#: A zygote's key: the interpreter, the variables frameworks read on import, and the Horovod
#: binding its ranks use (see :func:`binding_of`).
Key = tuple[str, tuple[tuple[str, str], ...], str]

#: Horovod's bindings by framework: one process must never hold two (the second one's calls go
#: to the first one's copy of Horovod: a rank forked from a zygote holding both made collectives
#: its fresh peers did not, and the job hung).
HOROVOD_BINDINGS = {"torch": ("horovod.torch",),
                    "tensorflow": ("horovod.tensorflow", "horovod.tensorflow.keras",
                                   "horovod.keras")}


def enabled(env: dict[str, str]) -> bool:
    """Whether a rank with ``env`` may start from a zygote: on Linux (fork), unless
    ``HVD_MAGICS_ZYGOTE=0`` (in the job's environment, ``--env``, or this process's), and not
    in a YARN container unless ``HVD_MAGICS_ZYGOTE=1``.

    A rank forked from a zygote is not a descendant of its executor: YARN without cgroups (its
    default process-tree monitor) neither counts such a rank's memory against the container
    nor kills it with the container. A rank started by its task is both."""
    if not sys.platform.startswith("linux"):
        return False
    chosen = env.get(ENV_ZYGOTE, os.environ.get(ENV_ZYGOTE))
    if chosen is not None:
        return chosen != "0"
    return ENV_YARN_CONTAINER not in os.environ


def is_late(name: str) -> bool:
    """Whether a rank's framework reads the variable ``name`` only once the job runs."""
    return name in ZYGOTE_LATE_ENV or name.startswith(ZYGOTE_LATE_ENV_PREFIXES)


def binding_of(preimport: list[str] | tuple[str, ...]) -> str:
    """The Horovod binding a job's leading imports name (``torch``, ``tensorflow``), or ``""``
    when they name none or both: its zygote then holds no Horovod module."""
    named = [name for name, modules in HOROVOD_BINDINGS.items()
             if any(module in preimport for module in modules)]
    return named[0] if len(named) == 1 else ""


def key_of(python: str, env: dict[str, str], preimport: list[str] | tuple[str, ...] = ()) -> Key:
    """The zygote key of a rank started with ``python`` in ``env`` whose job leads with the
    imports ``preimport``."""
    return (python, tuple(sorted((k, v) for k, v in env.items() if not is_late(k))),
            binding_of(preimport))


def frameworks(names: list[str] | tuple[str, ...], binding: str = "") -> frozenset[str]:
    """The modules of ``names`` a zygote for ``binding`` may import: frameworks of
    :data:`ZYGOTE_MODULES`, and of Horovod's modules only that binding's."""
    others = {module for name, modules in HOROVOD_BINDINGS.items() if name != binding
              for module in modules}
    return frozenset(name for name in names if name in ZYGOTE_MODULES and name not in others)


class _Progress:
    """Whether a zygote being started still works: its starter's CPU seconds grew within
    :data:`STARTING_STILL_S`, and :data:`STARTING_MOST_S` have not passed."""

    def __init__(self, path: str, began: float) -> None:
        self.path, self.began = path, began
        self.cpu, self.moved_at = starter_cpu(path), began

    def moving(self, now: float) -> bool:
        if now - self.began >= STARTING_MOST_S:
            return False
        cpu = starter_cpu(self.path)
        if cpu is not None and self.cpu is not None and cpu > self.cpu:
            self.moved_at = now
        self.cpu = cpu if cpu is not None else self.cpu
        return cpu is not None and now - self.moved_at < STARTING_STILL_S


#: How a rank ended whose keeper did not say its exit code, by what the keeper said instead.
_KEEPER_ENDED = {
    KEEPER_PARENT_GONE: "killed with its keeper (pid {pid}), which was stopped because the "
                        "host's zygote that forked it ended",
    KEEPER_TERMINATED: "killed with its keeper (pid {pid}), which something on the host "
                       "stopped (SIGTERM)",
}
_KEEPER_KILLED = ("ended with its keeper (pid {pid}), which was killed without a word "
                  "(SIGKILL, or the host ran out of memory)")
_KEEPER_UNHEARD = "ended unheard: this task lost its socket to the rank's keeper (pid {pid})"


class ZygoteRank:
    """A rank a zygote started, as its supervisor holds it (what :class:`subprocess.Popen` gives
    for a fresh one): the keeper's ``pid``, the rank's ``stdin`` and ``stdout``, :meth:`wait`."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], report: socket.socket,
                 said: bytes) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        #: How the rank ended when its keeper did not say its exit code (``""``: it did).
        self.how = ""
        self._report = report
        self._ended = threading.Event()
        threading.Thread(target=self._read_exit, args=(said,), name="hvd-rank-exit",
                         daemon=True).start()

    def _read_exit(self, said: bytes) -> None:
        lost: OSError | None = None
        try:
            while chunk := self._report.recv(256):
                said += chunk
        except OSError as exc:
            lost = exc
        code, stopped = None, None
        for line in said.decode(errors="replace").splitlines():
            if line.startswith("exit "):
                code = int(line.split()[1])
            elif line.startswith(KEEPER_STOPPED + " "):
                stopped = line.split()[1]
        if code is None:  # the keeper did not say: what is known instead
            known = (_KEEPER_ENDED[stopped] if stopped in _KEEPER_ENDED else
                     _KEEPER_UNHEARD if lost else _KEEPER_KILLED)
            self.how = known.format(pid=self.pid) + (f": {lost}" if lost and not stopped else "")
        self.returncode = -9 if code is None else code  # as Popen says of a SIGKILL
        self._report.close()
        self._ended.set()

    def wait(self, timeout: float | None = None) -> int:
        """The rank's exit code once its keeper ended (``subprocess.TimeoutExpired`` past
        ``timeout``)."""
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(ZYGOTE_MODULE, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class Zygote:
    """This process's connection to one of the host's zygotes, and what that zygote holds."""

    def __init__(self, connection: socket.socket, modules: frozenset[str]) -> None:
        self.modules = modules
        self.asked: frozenset[str] = frozenset()  # what it was asked to grow to hold
        self._socket = connection
        self._retired = False  # it takes no more ranks from this process
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, path: str) -> Zygote | None:
        """The zygote serving at ``path``, or ``None`` when none does."""
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        connection.settimeout(GREETING_WAIT_S)
        try:
            connection.connect(path)
            said = connection.recv(65536)
        except TimeoutError:  # connected (the system accepts for it) but never greeted
            with contextlib.suppress(OSError):
                os.unlink(path)  # the hung zygote sees it gone and retires, if it ever wakes
            said = b""
        except OSError:
            said = b""
        if not said.startswith(ZYGOTE_READY):
            connection.close()
            return None
        connection.settimeout(None)
        held = said[len(ZYGOTE_READY):].decode().strip()
        return cls(connection, frozenset(filter(None, held.split(","))))

    def usable(self) -> bool:
        """Whether it takes ranks (it did not retire, nor end)."""
        with self._lock:
            while not self._retired and select.select([self._socket], [], [], 0)[0]:
                self._retired = True  # it retires (``retire``) or hung up: both end its use
            return not self._retired

    def fork(self, env: dict[str, str], fds: list[int]) -> tuple[int, socket.socket, bytes] | None:
        """Ask for a keeper of a rank with ``env`` and the rank's ends of its pipes (stdin,
        stdout, events, control): ``(its pid, the socket to it, what it said after the pid)``,
        or ``None`` when the zygote did not start one."""
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request = json.dumps({"env": env, "cwd": os.getcwd()}).encode()
        try:
            with self._lock:
                socket.send_fds(self._socket, [request], [*fds, there.fileno()])
        except OSError:
            self._retired = True
            here.close()
            return None
        finally:
            there.close()
        said = b""
        here.settimeout(FORK_WAIT_S)
        try:
            while b"\n" not in said and (chunk := here.recv(256)):
                said += chunk
        except OSError:  # no answer in time: a zygote that hangs serves no one
            self.close()
        here.settimeout(None)
        line, _, rest = said.partition(b"\n")
        if not line.startswith(b"pid "):
            self._retired = True  # it refused (a module changed on disk): it starts no more
            here.close()
            return None
        return int(line.split()[1]), here, rest

    def grow(self, modules: frozenset[str]) -> None:
        """Ask it for a zygote that also imports ``modules``, which takes its place once it
        has (this one serves until then, and then says ``retire``)."""
        with self._lock, contextlib.suppress(OSError):
            self._socket.send(ZYGOTE_GROW + ",".join(sorted(modules)).encode())
        self.asked = modules

    def close(self) -> None:
        """Use it no more."""
        self._retired = True
        self._socket.close()


def start_zygote(path: str, python: str, env: dict[str, str],
                 modules: frozenset[str]) -> subprocess.Popen | None:
    """Start the zygote serving at ``path``, importing ``modules`` in ``env`` (``None``: another
    process is starting it, or one started there found CUDA loaded by its imports)."""
    if os.path.exists(cuda_mark(path)):  # its imports load CUDA: it would never serve
        return None
    lock = take_lock(path)
    if lock is None:
        return None
    setup = {ENV_ZYGOTE_SOCKET: path, ENV_ZYGOTE_LOCK_FD: str(lock),
             ENV_ZYGOTE_IMPORTS: ",".join(sorted(modules))}
    idle = os.environ.get(ENV_ZYGOTE_IDLE_S)
    if idle:
        setup[ENV_ZYGOTE_IDLE_S] = idle
    try:
        return subprocess.Popen(
            [python, "-u", "-m", ZYGOTE_MODULE],
            env={**{k: v for k, v in env.items() if not is_late(k)}, **setup},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(lock,), start_new_session=True)
    except OSError:
        return None
    finally:
        os.close(lock)  # the zygote holds it until it serves


#: The copies :func:`package_copy` made or found: ``(path, size, mtime_ns, folder) -> copy``.
_COPIES: dict[tuple[str, int, int, str], str] = {}


def package_copy(path: str, env: dict[str, str]) -> str:
    """Where ranks of ``env`` import the package zip at ``path`` from: its copy in the host's
    zygote folder (``packages/<sha256>-<name>``, made once), which every executor and application
    of the host that received the same zip shares; ``path`` itself when zygotes are off, the
    folder is not safe, or the copy cannot be made."""
    folder = zygote_dir(env) if enabled(env) else None
    if folder is None:
        return path
    try:
        found = os.stat(path)
        mark = (path, found.st_size, found.st_mtime_ns, folder)
        if mark in _COPIES:
            return _COPIES[mark]
        with open(path, "rb") as source:
            hashed = hashlib.sha256()  # read in blocks (hashlib.file_digest is Python 3.11's)
            for block in iter(lambda: source.read(1 << 20), b""):
                hashed.update(block)
            digest = hashed.hexdigest()[:24]
        packages = os.path.join(folder, "packages")
        os.makedirs(packages, mode=0o700, exist_ok=True)
        copy = os.path.join(packages, f"{digest}-{os.path.basename(path)}")
        if not os.path.exists(copy):
            with open(path, "rb") as source, tempfile.NamedTemporaryFile(
                    dir=packages, suffix=".part") as part:
                shutil.copyfileobj(source, part)
                part.flush()
                with contextlib.suppress(FileExistsError):  # another task made it first
                    os.link(part.name, copy)  # whole or absent, also then
    except OSError:
        return path
    _COPIES[mark] = copy
    return copy


def control_group() -> str:
    """This process's control groups (a container's): a zygote serves only its own, so that a
    rank runs, and is accounted, where its task does."""
    try:
        with open("/proc/self/cgroup") as groups:
            return groups.read()
    except OSError:
        return ""


class Zygotes:
    """This process's connections to the host's zygotes, by key, and what each key's jobs
    imported."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._zygotes: dict[Key, Zygote] = {}
        self._paths: dict[Key, str] = {}
        self._imported: dict[Key, frozenset[str]] = {}
        self._started: list[subprocess.Popen] = []  # reaped once they end
        #: Until when this process's ranks wait for a key's zygote being started (one deadline
        #: for all of them: a zygote that never comes costs a job STARTING_WAIT_S once).
        self._waits: dict[Key, float] = {}
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: its parent's connections are not its own."""
        self._lock = threading.Lock()
        self._zygotes, self._started, self._waits = {}, [], {}

    def _path(self, key: Key, env: dict[str, str]) -> str | None:
        path = self._paths.get(key)
        if path is None:
            folder = zygote_dir(env)
            path = socket_path(folder, (key, control_group())) if folder else None
            if path is not None:
                self._paths[key] = path
        return path

    def _connected(self, key: Key, env: dict[str, str]) -> Zygote | None:
        """The key's zygote, connected to when this process has no usable connection to it."""
        with self._lock:
            zygote = self._zygotes.get(key)
            if zygote is not None and zygote.usable():
                return zygote
            if zygote is not None:
                zygote.close()
            path = self._path(key, env)
            zygote = Zygote.connect(path) if path else None
            if zygote is None:
                self._zygotes.pop(key, None)
            else:
                self._zygotes[key] = zygote
                self._waits.pop(key, None)  # the next one started is waited for again
            return zygote

    def _wait_while_starting(self, key: Key, env: dict[str, str]) -> bool:
        """Wait while another process starts the key's zygote (until the key's deadline);
        whether its socket is there now."""
        path = self._path(key, env)
        if path is None or not starting(path):
            return False
        began = time.monotonic()
        with self._lock:
            deadline = self._waits.setdefault(key, began + STARTING_WAIT_S)
        progress = _Progress(path, began)
        while not os.path.exists(path):
            now = time.monotonic()
            if not starting(path) or (now >= deadline and not progress.moving(now)):
                return os.path.exists(path)
            time.sleep(STARTING_POLL_S)
        return True

    def _start_first(self, key: Key, python: str, env: dict[str, str],
                     preimport: list[str] | tuple[str, ...]) -> None:
        """Start the key's zygote for the first rank of an environment none serves, when its
        job's leading imports name frameworks: the job's ranks then wait for it and fork, one
        import for the job instead of one per rank (nothing is started where a socket is left:
        a zygote that hung, or one that retired and is replaced). Where the imports load CUDA
        (a GPU host), the zygote marks its path and ends without serving: the ranks waiting
        start fresh at once, and no zygote is started there again."""
        with self._lock:
            wanted = self._imported.get(key, frozenset()) | frameworks(preimport, key[2])
        path = self._path(key, env)
        if wanted and path is not None and not os.path.exists(path):
            self._start(path, python, env, wanted)

    def _start(self, path: str, python: str, env: dict[str, str],
               wanted: frozenset[str]) -> None:
        """Start the zygote serving at ``path`` importing ``wanted`` (unless another process
        starts one there), kept to be reaped once it ends."""
        started = start_zygote(path, python, env, wanted)
        if started is not None:
            with self._lock:
                self._started.append(started)

    def start_rank(self, python: str, env: dict[str, str], preimport: list[str] | tuple[str, ...],
                   events: int, control: int) -> ZygoteRank | None:
        """Start a rank from this key's zygote when one serves, or once one being started
        serves (``None``: start it fresh). ``events`` and ``control`` are the rank's ends of its
        event and control pipes. The first rank of a key starts its zygote when the job's
        leading imports name frameworks (:meth:`_start_first`); otherwise a zygote is started
        (or grown) once a job's ranks say what they imported (:meth:`learn`)."""
        if not enabled(env):
            return None
        key = key_of(python, env, preimport)
        zygote = self._connected(key, env)
        if zygote is None:
            self._start_first(key, python, env, preimport)
            if self._wait_while_starting(key, env):
                zygote = self._connected(key, env)
        if zygote is None:
            return None
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        try:
            started = zygote.fork(env, [stdin_read, stdout_write, events, control])
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        if started is None:
            os.close(stdin_write)
            os.close(stdout_read)
            return None
        pid, report, said = started
        return ZygoteRank(pid, os.fdopen(stdin_write, "wb"), os.fdopen(stdout_read, "rb"),
                          report, said)

    def ready(self) -> list[frozenset[str]]:
        """The frameworks each zygote serving this process's keys holds."""
        with self._lock:
            keys = list(self._paths)
        held = []
        for key in keys:
            zygote = self._connected(key, {})
            if zygote is not None:
                held.append(zygote.modules)
        return held

    def learn(self, python: str, env: dict[str, str], preimport: list[str] | tuple[str, ...],
              modules: list[str]) -> None:
        """Note the frameworks a rank of this environment and leading imports imported (its
        ``imported`` event): the key's zygote is started, or grown, to hold them."""
        if not enabled(env):
            return
        key = key_of(python, env, preimport)
        with self._lock:
            self._started = [proc for proc in self._started if proc.poll() is None]
            wanted = self._imported.get(key, frozenset()) | frameworks(modules, key[2])
            self._imported[key] = wanted
        wanted |= frameworks(preimport, key[2])
        if not wanted:
            return
        zygote = self._connected(key, env)
        if zygote is not None:
            if not (zygote.modules | zygote.asked) >= wanted:
                zygote.grow(wanted)
            return
        path = self._path(key, env)
        if path is not None:
            self._start(path, python, env, wanted)


#: The zygotes of this process.
ZYGOTES = Zygotes()
