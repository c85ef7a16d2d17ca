"""A zygote: a process that imports a job's frameworks once and forks each new rank from itself.

``python -m hvd_magics.rank.zygote``, started by a supervisor's process (a notebook's kernel for
``np < 0``, a Spark Python worker for a task: :mod:`hvd_magics.task.zygotes`). A fresh rank
process spends about 5 CPU seconds importing TensorFlow and 2 importing PyTorch before it runs a
line of the job; a rank forked from a zygote that has imported them starts at once.

The zygote imports the modules named by ``HVD_MAGICS_ZYGOTE_IMPORTS`` (only frameworks of
:data:`~hvd_magics.protocol.ZYGOTE_MODULES`), says ``ready`` on its socket to its owner, then
serves requests on it: each is the rank's environment and working folder with five file
descriptors (the rank's stdin, its stdout, its event pipe, its control pipe and a socket to its
supervisor). For each, the zygote forks a keeper that takes those on and then does what the
keeper of a fresh rank process does (:func:`hvd_magics.rank.rank_main.main`): it forks the rank
into its own process group, waits for it and writes ``exit CODE`` to the supervisor's socket.
The zygote reaps its keepers.

What a fork would otherwise share: the global random generators (seeded again in the rank), the
environment, ``sys.argv`` and ``sys.path[0]`` (the rank's own). It ends when its owner's end of
the socket closes (the owner process ended; its keepers then get ``SIGTERM`` and kill their
ranks), after ``HVD_MAGICS_ZYGOTE_IDLE_S`` seconds without a rank, or once retired and its ranks
ended: its owner retires it for a zygote that imports more (which it forks on request, ``grow``,
and outlives, so that a rank's ancestors stay its supervisor's) or for another environment's; it
retires itself when a file of a module it imported changed (a ``pip install -U`` between jobs),
refusing the rank, which its supervisor then starts fresh. A
zygote that finds a CUDA driver loaded in itself never says ``ready`` (a forked child cannot use
a CUDA context made before the fork).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import time

from hvd_magics.protocol import (ENV_CONTROL_FD, ENV_EVENT_FD, ENV_ZYGOTE_FD, ENV_ZYGOTE_IDLE_S,
                                 ENV_ZYGOTE_IMPORTS, ZYGOTE_MODULES, ZYGOTE_GROW,
                                 ZYGOTE_READY, ZYGOTE_RETIRE)
from hvd_magics.rank import rank_main
from hvd_magics.rank.process_group import die_with_parent

#: Seconds a zygote without ranks waits for a request before it ends, unless set.
IDLE_S = 600.0
#: The file descriptors a request carries, in this order.
STDIN, STDOUT, EVENTS, CONTROL, REPORT = range(5)
#: The largest request (the rank's environment as JSON).
MAX_REQUEST = 1 << 20


def import_frameworks(names: list[str]) -> None:
    """Import ``names`` that are frameworks of ZYGOTE_MODULES (in that order); one that fails
    is left for the rank to import and fail on."""
    horovod = [name for name in names if name.startswith("horovod.")]
    if "horovod.torch" in horovod and len(horovod) > 1:  # never two of Horovod's bindings
        names = [name for name in names if name not in horovod]
    for name in ZYGOTE_MODULES:
        if name in names:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


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
        die_with_parent(signal.SIGTERM)  # the zygote ends with its owner: the keeper stops then
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
        os.chdir(request["cwd"])
        if sys.path and sys.path[0] == first_path:  # python -m put the folder it started in first
            sys.path[0] = request["cwd"]
        sys.argv[:] = [rank_main.__file__]
    except BaseException:  # noqa: BLE001 - the supervisor sees the socket close without a pid
        os._exit(1)
    rank_main.main(report)
    os._exit(1)


def begin(owner: socket.socket, names: list[str], idle_s: float, first_path: str) -> None:
    """Import ``names``, tell ``owner`` ready with the frameworks now imported, serve it (never
    returns)."""
    import_frameworks(names)
    if cuda_loaded():
        os._exit(0)
    present = ",".join(name for name in ZYGOTE_MODULES if name in sys.modules)
    owner.sendall(ZYGOTE_READY + b" " + present.encode())
    serve(owner, idle_s, first_path)
    os._exit(0)


def _reap(keepers: set[int]) -> bool:
    """Reap the children that ended; whether a keeper was among them."""
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


def serve(owner: socket.socket, idle_s: float, first_path: str) -> None:
    """Fork a keeper for each request from ``owner`` until it closes, the zygote is idle for
    ``idle_s``, a module it imported changed on disk, or it was retired and its keepers ended.
    Asked to grow, fork a zygote that imports more and serves a new owner socket."""
    marks = module_marks()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
    keepers: set[int] = set()
    last_used = time.monotonic()
    retired = False

    def in_child() -> None:
        owner.close()
        os.close(wake_read)
        os.close(wake_write)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)

    while not (retired and not keepers):
        wait = max(idle_s - (time.monotonic() - last_used), 0.0) if not keepers else None
        readable = select.select([owner, wake_read], [], [], wait)[0]
        if wake_read in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
        if _reap(keepers):
            last_used = time.monotonic()
        if owner not in readable:
            if not readable and not keepers:
                return  # idle
            continue
        message, fds, _flags, _address = socket.recv_fds(owner, MAX_REQUEST, 5)
        if not message:  # the owner is gone: its keepers stop with this process
            return
        if message == ZYGOTE_RETIRE:
            retired = True
        elif message.startswith(ZYGOTE_GROW) and len(fds) == 1 and not retired:
            if changed(marks):  # what it holds is stale: so would be a zygote it forks
                retired = True
            elif (pid := os.fork()) == 0:
                in_child()
                begin(socket.socket(fileno=fds[0]), message[len(ZYGOTE_GROW):].decode().split(","),
                      idle_s, first_path)
            else:  # waited for like a keeper: a rank's ancestors stay its task's process tree
                keepers.add(pid)
        elif len(fds) == 5 and not retired and changed(marks):
            retired = True  # stale: refused (the owner starts this rank and the next ones fresh)
        elif len(fds) == 5 and not retired:
            pid = os.fork()
            if pid == 0:
                in_child()
                become_keeper(json.loads(message), fds, first_path)
            keepers.add(pid)
            last_used = time.monotonic()
        for fd in fds:
            os.close(fd)


def main() -> None:
    """Import, say ready, serve."""
    owner = socket.socket(fileno=int(os.environ.pop(ENV_ZYGOTE_FD)))
    names = os.environ.pop(ENV_ZYGOTE_IMPORTS, "").split(",")
    idle_s = float(os.environ.pop(ENV_ZYGOTE_IDLE_S, "") or IDLE_S)
    begin(owner, names, idle_s, sys.path[0] if sys.path else "")


if __name__ == "__main__":
    main()
