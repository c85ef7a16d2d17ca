"""A host's keeper of kept steps: the process that serves a job's steps held in this host's memory
to the ranks of other hosts, drops them when the job is done, and removes what nobody touched
for ``HVD_MAGICS_KEEP_IDLE_S`` (600 s).

A sharded job's ranks send each part they keep to the next host's keeper as well (``put``), which
holds it beside its own host's parts: a lost host's parts are then on its peer.

The steps themselves are files in shared memory (:mod:`hvd_magics.common.kept_steps`): they
outlive the ranks that wrote them, their Spark tasks and this keeper. The first rank on a host
that keeps a step starts the host's keeper (:func:`ensure_keeper`) as a process of its own
session, outside its task and its Spark worker, as a zygote is; it writes ``keeper.json`` (its
pid and port) in the host's folder, and ends once it holds nothing: at once when the last job's
steps were dropped (the job succeeded), else :data:`EMPTY_S` after they went.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

from hvd_magics.common.step_keeper_wire import MISSING, digest, length_bytes
from hvd_magics.common.process_group import alive
from hvd_magics.common.kept_steps import PartName, older_parts, secret_matches
from hvd_magics.protocol import ENV_KEEP_IDLE_S

#: Seconds a job's kept steps stay untouched before the keeper removes them, by default.
IDLE_S = 600.0
#: Seconds a keeper holding nothing (its jobs' steps dropped or removed, even by the driver on
#: its own machine before a keeper it was never told of) goes on before it ends.
EMPTY_S = 10.0
#: Seconds a rank waits for a keeper it started to say its port.
START_WAIT_S = 10.0
KEEPER_FILE = "keeper.json"


def running_keeper(host_folder: Path) -> tuple[int, int] | None:
    """``(pid, port)`` of the keeper serving ``host_folder``, or ``None``."""
    try:
        said = json.loads((host_folder / KEEPER_FILE).read_text())
        pid, port = int(said["pid"]), int(said["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (pid, port) if alive(pid) else None


def ensure_keeper(host_folder: Path) -> int | None:
    """The port of ``host_folder``'s keeper, started when none runs; ``None`` when none could
    start (the steps are kept all the same: only serving them to other hosts needs it)."""
    found = running_keeper(host_folder)
    if found is not None:
        return found[1]
    host_folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(host_folder / "keeper.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter a host; the others find its keeper
        found = running_keeper(host_folder)
        if found is not None:
            return found[1]
        package = str(Path(__file__).resolve().parent.parent.parent)
        if ".zip" in __file__:  # the package's zip an executor was shipped
            package = __file__[:__file__.index(".zip") + 4]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [package, *filter(None, [os.environ.get("PYTHONPATH")])])}
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            # it forks the keeper and ends: the keeper is no child of this rank's
            subprocess.run([sys.executable, "-m", "hvd_magics.rank.step_keeper",
                            str(host_folder)], env=env, start_new_session=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, close_fds=True, timeout=START_WAIT_S)
            deadline = time.monotonic() + START_WAIT_S
            while time.monotonic() < deadline:
                found = running_keeper(host_folder)
                if found is not None:
                    return found[1]
                time.sleep(0.02)  # polls the keeper's file: a condition, not a pause
    return None


class _Handler(socketserver.StreamRequestHandler):
    """One request (:mod:`hvd_magics.common.step_keeper_wire`)."""

    server: _KeeperServer

    def handle(self) -> None:
        try:
            asked = json.loads(self.rfile.readline(1 << 16))
            folder = self.server.folder / str(asked["job"]).replace("/", "_")
            name = Path(str(asked["file"])).name
        except (ValueError, KeyError, TypeError):
            return
        said = digest(str(asked.get("secret", "")))
        if asked.get("op") == "put":
            self.wfile.write(b"\x01" if _receive(self.rfile, folder, name, said,
                                                  int(asked.get("size", 0))) else b"\x00")
            return
        if asked.get("op") == "drop" and not folder.exists():  # gone already (the driver's
            self.wfile.write(b"\x01")  # own removal on its machine came first)
            self.server.dropped.set()
            return
        if not secret_matches(folder, said):
            self.wfile.write(length_bytes(MISSING) if asked.get("op") == "get" else b"\x00")
            return
        if asked.get("op") == "drop":
            shutil.rmtree(folder, ignore_errors=True)
            self.wfile.write(b"\x01")
            self.server.dropped.set()  # ends now if it holds nothing else
            return
        try:
            data = (folder / name).read_bytes() if name.startswith("step-") else None
        except OSError:
            data = None
        self.wfile.write(length_bytes(MISSING) if data is None
                         else length_bytes(len(data)) + data)


def _receive(stream: io.BufferedIOBase, folder: Path, name: str, said: str, size: int) -> bool:
    """Hold a peer's part ``name`` of ``size`` bytes read from ``stream`` in the job's
    ``folder`` (made with the secret's digest ``said`` when the host holds nothing of the job),
    put in place whole; that part's steps but the newest two removed. Whether it is held."""
    found = PartName.parse(name)
    if found is None:
        return False
    if not folder.is_dir():
        folder.mkdir(mode=0o700, exist_ok=True)
        marked = folder / f".secret.{os.getpid()}.{threading.get_ident()}"
        marked.write_text(said)
        os.replace(marked, folder / ".secret")
    if not secret_matches(folder, said):
        return False
    temporary = folder / f".{name}.put-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(temporary, "wb") as out:
            left = size
            while left:
                chunk = stream.read(min(left, 1 << 22))
                if not chunk:
                    return False
                out.write(chunk)
                left -= len(chunk)
        os.replace(temporary, folder / name)
    except OSError:
        return False
    finally:
        temporary.unlink(missing_ok=True)
    for old in older_parts(folder, found.part, found.parts, found.step):
        old.unlink(missing_ok=True)
    return True


class _KeeperServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, folder: Path) -> None:
        super().__init__(("0.0.0.0", 0), _Handler)
        self.folder = folder
        #: Set when a job's steps were dropped (its job succeeded).
        self.dropped = threading.Event()


def _newest_touch(job: Path) -> float:
    times = [job.stat().st_mtime]
    with contextlib.suppress(OSError):
        times += [entry.stat().st_mtime for entry in os.scandir(job)]
    return max(times)


def _sweep(folder: Path, idle_s: float) -> bool:
    """Remove the jobs untouched for ``idle_s``; whether any job is left."""
    now, left = time.time(), False
    for job in folder.iterdir() if folder.is_dir() else ():
        if not job.is_dir():
            continue
        try:
            idle = now - _newest_touch(job) > idle_s
        except OSError:
            continue
        if idle:
            shutil.rmtree(job, ignore_errors=True)
        else:
            left = True
    return left


def serve(folder: Path, idle_s: float) -> None:
    """Serve ``folder``'s kept steps until nothing is left in it and ``idle_s`` passed."""
    server = _KeeperServer(folder)
    (folder / f".{KEEPER_FILE}.{os.getpid()}").write_text(
        json.dumps({"pid": os.getpid(), "port": server.server_address[1]}))
    os.replace(folder / f".{KEEPER_FILE}.{os.getpid()}", folder / KEEPER_FILE)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    last_held = time.monotonic()
    try:
        while True:
            dropped = server.dropped.wait(min(idle_s / 4, 5.0))  # its pace, or a drop
            server.dropped.clear()
            if _sweep(folder, idle_s):
                last_held = time.monotonic()
            elif dropped or time.monotonic() - last_held > min(idle_s, EMPTY_S):
                return  # its jobs succeeded or were removed, and nothing else is held
    finally:
        server.shutdown()
        found = running_keeper(folder)
        if found is not None and found[0] == os.getpid():
            (folder / KEEPER_FILE).unlink(missing_ok=True)


def main() -> None:
    """Fork the keeper of the folder ``argv[1]`` and end (its starter waits for this)."""
    folder = Path(sys.argv[1])
    if os.fork():
        os._exit(0)
    os.setsid()
    os.chdir("/")
    serve(folder, float(os.environ.get(ENV_KEEP_IDLE_S) or IDLE_S))


if __name__ == "__main__":
    main()
