"""Start ranks from zygotes: processes that imported the job's frameworks once (the owner side).

A process that starts ranks (a notebook's kernel for ``np < 0``, a Spark Python worker for a
task) keeps, per rank environment, one zygote (:mod:`hvd_magics.rank.zygote`): its child, which
ends with it. A rank whose environment has a ready zygote is forked from it in milliseconds; a
rank without one starts as a fresh interpreter, as it always did, and its job's frameworks (the
leading imports the job named, and those its ranks said they imported at their end) become the
imports of the zygote started for the next job of that environment once the ranks end, so that
it imports between jobs rather than beside a job's own fresh ranks.

Ranks whose environments differ only in :data:`~hvd_magics.protocol.ZYGOTE_LATE_ENV` (their
rank, their rendezvous, their GPU) share a zygote; any other difference (another Python,
``PYTHONPATH``, ``TF_USE_LEGACY_KERAS``, ``OMP_NUM_THREADS``) gets a zygote of its own. A zygote
that ended (idle, or a module it imported changed on disk) is started again when needed.
``HVD_MAGICS_ZYGOTE=0`` starts every rank fresh.
"""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
from typing import IO

from hvd_magics.protocol import (ENV_ZYGOTE, ENV_ZYGOTE_FD, ENV_ZYGOTE_IDLE_S, ENV_ZYGOTE_IMPORTS,
                                 ZYGOTE_LATE_ENV, ZYGOTE_LATE_ENV_PREFIXES, ZYGOTE_MODULE,
                                 ZYGOTE_GROW, ZYGOTE_MODULES, ZYGOTE_READY,
                                 ZYGOTE_RETIRE)

#: Seconds a supervisor waits for a zygote to fork a keeper (a zygote alive and ready answers
#: in milliseconds); past it, the rank starts fresh and the zygote is stopped.
FORK_WAIT_S = 30.0

#: Most zygotes one process keeps (each holds its frameworks' memory: about 0.5 GB with
#: TensorFlow); the least used one is retired past it.
MOST_ZYGOTES = 3

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
    ``HVD_MAGICS_ZYGOTE=0`` (in the job's environment, ``--env``, or this process's)."""
    return sys.platform.startswith("linux") and env.get(
        ENV_ZYGOTE, os.environ.get(ENV_ZYGOTE, "1")) != "0"


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


class ZygoteRank:
    """A rank a zygote started, as its supervisor holds it (what :class:`subprocess.Popen` gives
    for a fresh one): the keeper's ``pid``, the rank's ``stdin`` and ``stdout``, :meth:`wait`."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], report: socket.socket,
                 said: bytes) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        self._report = report
        self._ended = threading.Event()
        threading.Thread(target=self._read_exit, args=(said,), name="hvd-rank-exit",
                         daemon=True).start()

    def _read_exit(self, said: bytes) -> None:
        try:
            while chunk := self._report.recv(256):
                said += chunk
        except OSError:
            pass
        code = -9  # the keeper was killed before it could tell (SIGKILL, as Popen would say)
        for line in said.decode(errors="replace").splitlines():
            if line.startswith("exit "):
                code = int(line.split()[1])
        self.returncode = code
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
    """One zygote process of this owner: what it was asked to import and, once ready, what it
    holds."""

    def __init__(self, owner_end: socket.socket, modules: frozenset[str],
                 proc: subprocess.Popen | None = None) -> None:
        self.modules = modules
        self.proc = proc
        self._socket = owner_end
        self._ready = False
        self._ended = False  # the process is gone
        self._retired = False  # it gets no more ranks
        self._lock = threading.Lock()

    @classmethod
    def start(cls, python: str, env: dict[str, str], modules: frozenset[str]) -> Zygote:
        """Start a zygote process importing ``modules`` in ``env``."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        setup = {ENV_ZYGOTE_FD: str(theirs.fileno()),
                 ENV_ZYGOTE_IMPORTS: ",".join(sorted(modules))}
        idle = os.environ.get(ENV_ZYGOTE_IDLE_S)
        if idle:
            setup[ENV_ZYGOTE_IDLE_S] = idle
        try:
            proc = subprocess.Popen(
                [python, "-u", "-m", ZYGOTE_MODULE], env={**env, **setup},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()
        return cls(mine, modules, proc)

    def grow(self, modules: frozenset[str]) -> Zygote | None:
        """A zygote forked from this one that also imports ``modules`` (this one retired)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                socket.send_fds(self._socket, [ZYGOTE_GROW + ",".join(sorted(modules)).encode()],
                                [theirs.fileno()])
        except OSError:
            mine.close()
            return None
        finally:
            theirs.close()
        self.retire()
        return Zygote(mine, self.modules | modules)

    def _listen(self) -> None:
        """Read what it said, without waiting: ready (with what it holds), or gone."""
        while not self._ended and select.select([self._socket], [], [], 0)[0]:
            try:
                said = self._socket.recv(65536)
            except OSError:
                said = b""
            if said.startswith(ZYGOTE_READY):
                self._ready = True
                held = said[len(ZYGOTE_READY):].decode().strip()
                self.modules = self.modules | frozenset(filter(None, held.split(",")))
            else:
                self._ended = True  # it ended (idle, stale, a CUDA driver loaded) or hangs up
        if self.proc is not None and self.proc.poll() is not None:
            self._ended = True

    def alive(self) -> bool:
        """Whether its process runs (a retired one too, until its ranks have ended)."""
        with self._lock:
            self._listen()
            return not self._ended

    def usable(self) -> bool:
        """Whether it imports or waits for ranks."""
        return self.alive() and not self._retired

    def is_ready(self) -> bool:
        """Whether it has imported its modules and waits for ranks."""
        return self.usable() and self._ready

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
            self._ended = True
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
            self.stop()
        here.settimeout(None)
        line, _, rest = said.partition(b"\n")
        if not line.startswith(b"pid "):
            self._retired = True  # it refused (a module changed on disk): it starts no more
            here.close()
            return None
        return int(line.split()[1]), here, rest

    def retire(self) -> None:
        """Let it end once the ranks it started have (it starts no more)."""
        with self._lock:
            self._retired = True
            try:
                self._socket.send(ZYGOTE_RETIRE)
            except OSError:
                pass

    def stop(self) -> None:
        """End it now (its keepers stop their ranks)."""
        self._ended = True
        self._socket.close()  # it ends when its owner's end closes
        if self.proc is not None:
            self.proc.wait()


class Zygotes:
    """This process's zygotes, by key, and what each key's jobs imported."""

    def __init__(self, most: int = MOST_ZYGOTES) -> None:
        self._lock = threading.Lock()
        self._most = most
        self._zygotes: dict[Key, Zygote] = {}  # the latest used last
        self._retired: list[Zygote] = []
        self._imported: dict[Key, frozenset[str]] = {}

    def start_rank(self, python: str, env: dict[str, str], preimport: list[str] | tuple[str, ...],
                   events: int, control: int) -> ZygoteRank | None:
        """Start a rank from this key's zygote when it is ready (``None``: start it fresh).
        ``events`` and ``control`` are the rank's ends of its event and control pipes. A zygote
        is started (or grown) only once a job's ranks say what they imported (:meth:`learn`):
        its imports then run between jobs, not beside a job's own fresh ranks."""
        if not enabled(env):
            return None
        key = key_of(python, env, preimport)
        with self._lock:
            zygote = self._zygotes.pop(key, None)
            if zygote is not None:
                self._zygotes[key] = zygote  # the latest used last
        if zygote is None or not zygote.is_ready():
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
        """The frameworks each of this process's ready zygotes holds."""
        with self._lock:
            zygotes = list(self._zygotes.values())
        return [zygote.modules for zygote in zygotes if zygote.is_ready()]

    def learn(self, python: str, env: dict[str, str], preimport: list[str] | tuple[str, ...],
              modules: list[str]) -> None:
        """Note the frameworks a rank of this environment and leading imports imported (its
        ``imported`` event): the key's next zygote imports them."""
        if not enabled(env):
            return
        key = key_of(python, env, preimport)
        with self._lock:
            self._imported[key] = self._imported.get(key, frozenset()) | frameworks(modules,
                                                                                    key[2])
        self._zygote(key, python, env, frameworks(preimport, key[2]))

    def _zygote(self, key: Key, python: str, env: dict[str, str],
                wanted: frozenset[str]) -> Zygote | None:
        """The key's zygote, started (or grown from the one it has) when it has none alive
        holding every module ``wanted`` or learnt; past :data:`MOST_ZYGOTES`, the least used
        one is retired."""
        with self._lock:
            self._retired = [old for old in self._retired if old.alive()]
            wanted = wanted | self._imported.get(key, frozenset())
            zygote = self._zygotes.pop(key, None)
            if zygote is not None and not zygote.usable():
                if zygote.alive():
                    self._retired.append(zygote)
                zygote = None
            if zygote is not None and zygote.modules >= wanted:
                self._zygotes[key] = zygote
                return zygote
            if not wanted:
                return None
            grown = zygote.grow(wanted) if zygote is not None else None
            if zygote is not None:
                self._retired.append(zygote)
            while len(self._zygotes) >= self._most:
                least = next(iter(self._zygotes))
                self._zygotes[least].retire()
                self._retired.append(self._zygotes.pop(least))
            zygote = grown or Zygote.start(python, {k: v for k, v in env.items() if not is_late(k)},
                                           wanted)
            self._zygotes[key] = zygote
            return zygote


#: The zygotes of this process.
ZYGOTES = Zygotes()

