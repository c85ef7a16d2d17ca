"""A zygote: a process that imports a job's frameworks once and forks each new rank from itself.

``python -m hvd_magics.rank.zygote``, started by a process that starts ranks (a notebook's kernel
for ``np < 0``, a Spark Python worker for a task: :mod:`hvd_magics.task.zygotes`) and then shared
by every such process of its user on the host whose rank environment is the same: the kernels,
the Spark applications' workers, a Connect server's. A fresh rank process spends about 5 CPU
seconds importing TensorFlow and 2 importing PyTorch before it runs a line of the job; a rank
forked from a zygote that has imported them starts at once.

The zygote imports the modules named by ``HVD_MAGICS_ZYGOTE_IMPORTS`` (only frameworks of
:data:`~hvd_magics.protocol.ZYGOTE_MODULES`), then serves at the socket path
``HVD_MAGICS_ZYGOTE_SOCKET`` (bound under another name and renamed there, so that it appears
ready; only processes of its own user are served). To each process that connects it says
``ready`` and what it holds, then serves its requests: each is the rank's environment and
working folder with five file descriptors (the rank's stdin, its stdout, its event pipe, its
control pipe and a socket to its supervisor). For each, the zygote forks a keeper that takes
those on and then does what the keeper of a fresh rank process does
(:func:`hvd_magics.rank.rank_main.main`): it forks the rank into its own process group, waits for
it and writes ``exit CODE`` to the supervisor's socket; it stops the rank when the supervisor's
end closes (the supervisor's process died), and, stopped otherwise (its zygote ended, or a
``SIGTERM``), writes ``stopped WHY`` instead: a keeper that wrote neither was killed outright.
The zygote reaps its keepers. A zygote it grew is no keeper of its: once retired, it ends when
its own ranks have, and the grown one serves on by itself.

What a fork would otherwise share: the global random generators (seeded again in the rank), the
environment, ``sys.argv`` and ``sys.path[0]`` (the rank's own). It ends after
``HVD_MAGICS_ZYGOTE_IDLE_S`` seconds without a rank, or once retired and its ranks ended: asked
to ``grow``, it forks a zygote that imports more and serves on (ranks that import the rest
themselves) until that one takes its path over, then retires; it retires itself
when a file of a module it imported changed (a ``pip install -U`` between jobs), refusing the
rank, which its supervisor then starts fresh. A zygote that finds a CUDA driver loaded in itself
never serves (a forked child cannot use a CUDA context made before the fork), and marks its path
so that no zygote is started there again (:func:`~hvd_magics.common.zygote_place.cuda_mark`).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import time

from hvd_magics.protocol import (ENV_CONTROL_FD, ENV_EVENT_FD, ENV_ZYGOTE_IDLE_S,
                                 ENV_ZYGOTE_IMPORTS, ENV_ZYGOTE_LOCK_FD, ENV_ZYGOTE_SOCKET,
                                 ZYGOTE_COMPANIONS, ZYGOTE_GROW, ZYGOTE_MODULES, ZYGOTE_READY,
                                 ZYGOTE_RETIRE)
from hvd_magics.rank import pool_loop, rank_main
from hvd_magics.common.process_group import die_with_parent
from hvd_magics.common.zygote_place import cuda_mark, take_lock

#: Seconds a zygote without ranks waits for a request before it ends, unless set.
IDLE_S = 600.0
#: The file descriptors a request carries, in this order.
STDIN, STDOUT, EVENTS, CONTROL, REPORT = range(5)
#: The largest request (the rank's environment as JSON).
MAX_REQUEST = 1 << 20
#: How often a zygote looks whether another took its path over (then it retires), seconds.
TAKEN_OVER_POLL_S = 5.0


def import_frameworks(names: list[str]) -> None:
    """Import ``names`` that are frameworks of ZYGOTE_MODULES (in that order), each with its
    :data:`~hvd_magics.protocol.ZYGOTE_COMPANIONS`; one that fails is left for the rank to
    import and fail on. Then look at what was imported as a warm pool's rank would
    (:func:`~hvd_magics.rank.pool_loop.look_at_imported`), once for every rank forked."""
    horovod = [name for name in names if name.startswith("horovod.")]
    if "horovod.torch" in horovod and len(horovod) > 1:  # never two of Horovod's bindings
        names = [name for name in names if name not in horovod]
    for name in ZYGOTE_MODULES:
        if name in names:
            for module in (name, *ZYGOTE_COMPANIONS.get(name, ())):
                with contextlib.suppress(Exception):
                    importlib.import_module(module)
    pool_loop.look_at_imported()


def module_marks() -> dict[str, tuple[int, int]]:
    """``(mtime_ns, size)`` of the file of each module of this package and each framework
    imported, to see a module changed on disk since (a new version installed)."""
    marks = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "hvd_magics" and name not in ZYGOTE_MODULES:
            continue
        path = getattr(module, "__file__", None)
        if path:
            with contextlib.suppress(OSError):
                stat = os.stat(path)
                marks[path] = (stat.st_mtime_ns, stat.st_size)
    return marks


def changed(marks: dict[str, tuple[int, int]]) -> bool:
    """Whether a file of ``marks`` changed or went since."""
    for path, mark in marks.items():
        try:
            stat = os.stat(path)
        except OSError:
            return True
        if (stat.st_mtime_ns, stat.st_size) != mark:
            return True
    return False


def cuda_loaded() -> bool:
    """Whether a CUDA driver library is mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:
        return False


def become_keeper(request: dict, fds: list[int], first_path: str) -> None:
    """In the forked child: take on the rank's environment, folder and pipes, then keep the rank
    as :func:`hvd_magics.rank.rank_main.main` does (never returns)."""
    try:
        os.setsid()
        die_with_parent(signal.SIGTERM)  # a zygote killed takes its ranks along
        report = socket.socket(fileno=fds[REPORT])
        report.sendall(f"pid {os.getpid()}\n".encode())
        os.dup2(fds[STDIN], 0)
        os.dup2(fds[STDOUT], 1)
        os.dup2(fds[STDOUT], 2)
        for fd in (fds[STDIN], fds[STDOUT]):
            os.close(fd)
        for fd in (fds[EVENTS], fds[CONTROL]):
            os.set_inheritable(fd, True)  # as a fresh rank has them (the supervisor passed them)
        env = dict(request["env"])
        env[ENV_EVENT_FD], env[ENV_CONTROL_FD] = str(fds[EVENTS]), str(fds[CONTROL])
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # read from the rank's TMPDIR again (a late variable)
        os.chdir(request["cwd"])
        if sys.path and sys.path[0] == first_path:  # python -m put the folder it started in first
            sys.path[0] = request["cwd"]
        sys.argv[:] = [rank_main.__file__]
    except BaseException:  # noqa: BLE001 - the supervisor sees the socket close without a pid
        os._exit(1)
    rank_main.main(report)
    os._exit(1)


def listen_at(path: str) -> socket.socket:
    """A socket listening at ``path`` for this user only: bound under a name of its own, then
    renamed to ``path`` (replacing a zygote's there), so that whoever connects finds it ready."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    own = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(own)
    listener.bind(own)
    os.chmod(own, 0o600)
    listener.listen(64)
    os.rename(own, path)
    return listener


def same_user(connection: socket.socket) -> bool:
    """Whether the process at the other end of ``connection`` runs as this user."""
    creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def begin(path: str, names: list[str], idle_s: float, first_path: str,
          lock_fd: int | None) -> None:
    """Import ``names``, serve at ``path`` (releasing the lock ``lock_fd`` once there), never
    returns. The lock's file holds this process's id while it imports: ranks waiting for it
    read whether its imports still move (:func:`hvd_magics.common.zygote_place.starter_cpu`)."""
    if lock_fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, str(os.getpid()).encode(), 0)
    import_frameworks(names)
    if cuda_loaded():  # a forked rank could not use it: mark the path, so none starts here again
        with contextlib.suppress(OSError):
            os.close(os.open(cuda_mark(path), os.O_WRONLY | os.O_CREAT, 0o600))
        os._exit(0)
    try:
        listener = listen_at(path)
    except OSError:
        os._exit(0)
    if lock_fd is not None:
        os.close(lock_fd)
    present = ",".join(name for name in ZYGOTE_MODULES if name in sys.modules)
    Zygote(listener, path, ZYGOTE_READY + b" " + present.encode(), idle_s, first_path).serve()
    os._exit(0)


def _reap(keepers: set[int], grown: set[int]) -> bool:
    """Reap the children that ended (keepers, and zygotes it grew); whether a keeper was among
    them."""
    ended = False
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if not pid:
            return ended
        ended |= pid in keepers
        keepers.discard(pid)
        grown.discard(pid)


class Zygote:
    """The serving zygote: its listening socket, the processes connected to it, its keepers."""

    def __init__(self, listener: socket.socket, path: str, greeting: bytes, idle_s: float,
                 first_path: str) -> None:
        self.listener: socket.socket | None = listener
        self.inode = os.stat(path).st_ino
        self.path, self.greeting, self.idle_s, self.first_path = path, greeting, idle_s, first_path
        self.owners: list[socket.socket] = []
        self.keepers: set[int] = set()
        #: The zygotes it grew: its children, not its ranks' keepers (a retired zygote that
        #: waited for them lived as long as they did, in chains of 4 to 6 per host).
        self.grown: set[int] = set()
        self.retired = False
        self.marks = module_marks()

    def taken_over(self) -> bool:
        """Whether its path is gone or another zygote serves there (two started at once)."""
        if self.listener is None:
            return False
        try:
            return os.stat(self.path).st_ino != self.inode
        except OSError:
            return True

    def retire(self) -> None:
        """Take no more ranks: leave the path (unless another zygote took it over), tell the
        connected processes, end once the keepers have."""
        if self.retired:
            return
        self.retired = True
        if self.listener is not None:
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self.inode:
                    os.unlink(self.path)
            self.listener.close()
            self.listener = None
        for owner in self.owners:
            with contextlib.suppress(OSError):
                owner.send(ZYGOTE_RETIRE)
            owner.close()
        self.owners = []

    def serve(self) -> None:
        """Fork a keeper for each request until the zygote is idle for ``idle_s``, or retired
        and its keepers ended."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
        last_used = time.monotonic()

        def in_child() -> None:
            if self.listener is not None:
                self.listener.close()
            for owner in self.owners:
                owner.close()
            os.close(wake_read)
            os.close(wake_write)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)

        while not (self.retired and not self.keepers):
            wait = TAKEN_OVER_POLL_S
            if not self.keepers:
                wait = min(wait, max(self.idle_s - (time.monotonic() - last_used), 0.0))
            listening = [self.listener] if self.listener is not None else []
            watched: list[socket.socket | int] = [*listening, wake_read, *self.owners]
            readable = select.select(watched, [], [], wait)[0]
            if wake_read in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
            if _reap(self.keepers, self.grown):
                last_used = time.monotonic()
            if self.taken_over() or (not self.keepers and
                                     time.monotonic() - last_used >= self.idle_s):
                self.retire()  # another serves at its path, or idle
                continue
            if self.listener is not None and self.listener in readable:
                self._accept(self.listener)
            for owner in [owner for owner in self.owners if owner in readable]:
                if owner not in self.owners:  # retired meanwhile (closed)
                    continue
                pid = self._answer(owner, in_child)
                if pid and pid not in self.grown:
                    self.keepers.add(pid)
                    last_used = time.monotonic()
        os.close(wake_read)

    def _accept(self, listener: socket.socket) -> None:
        try:
            owner, _ = listener.accept()
        except OSError:
            return
        if not same_user(owner):
            owner.close()
            return
        try:
            owner.send(self.greeting)
        except OSError:
            owner.close()
            return
        self.owners.append(owner)

    def _answer(self, owner: socket.socket, in_child) -> int | None:
        """Serve one message of ``owner``: the pid of a keeper or grown zygote it forked."""
        try:
            message, fds, _flags, _address = socket.recv_fds(owner, MAX_REQUEST, 5)
        except OSError:
            message, fds = b"", []
        try:
            if not message:  # that process is gone (its keepers watch their own sockets)
                self.owners.remove(owner)
                owner.close()
                return None
            if self.retired or changed(self.marks):
                self.retire()  # stale: refused (the owner starts this rank and the next fresh)
                return None
            if message.startswith(ZYGOTE_GROW):
                lock = take_lock(self.path)
                if lock is None:  # another process starts a zygote here
                    return None
                names = message[len(ZYGOTE_GROW):].decode().split(",")
                if (pid := os.fork()) == 0:
                    in_child()
                    begin(self.path, names, self.idle_s, self.first_path, lock)
                os.close(lock)  # the grown one holds it until it serves at the path; until
                self.grown.add(pid)  # then this one serves, and retires once it sees it taken
                return pid  # over, ending once its own ranks have
            if len(fds) == 5:
                if (pid := os.fork()) == 0:
                    in_child()
                    become_keeper(json.loads(message), fds, self.first_path)
                return pid
            return None
        finally:
            for fd in fds:
                os.close(fd)


def main() -> None:
    """Import, serve."""
    path = os.environ.pop(ENV_ZYGOTE_SOCKET)
    lock = os.environ.pop(ENV_ZYGOTE_LOCK_FD, "")
    names = os.environ.pop(ENV_ZYGOTE_IMPORTS, "").split(",")
    idle_s = float(os.environ.pop(ENV_ZYGOTE_IDLE_S, "") or IDLE_S)
    begin(path, names, idle_s, sys.path[0] if sys.path else "", int(lock) if lock else None)


if __name__ == "__main__":
    main()
