"""Start one rank process and forward what it says, in order, to an event sink.

Used in two places: inside a Spark barrier task (the sink signs events and sends them to the
driver) and on the driver for ``np < 0`` (the sink puts them straight on the driver's queue).
The rank runs in its own process session, dies with its supervisor (``PR_SET_PDEATHSIG``), and
:meth:`RankProcess.kill` takes down its whole process group.
"""
from __future__ import annotations

import base64
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from typing import Any, Callable

from hvd_magics.rank_events import ENV_EVENT_FD
from hvd_magics.timeline import ENV_WANT_TIMELINE

#: ``sink(kind, **payload)`` receives every event of the rank, from several threads.
EventSink = Callable[..., None]

#: Bytes of a timeline file sent in one ``timeline_chunk`` event.
TIMELINE_CHUNK_BYTES = 1 << 20

#: Most lines sent in one ``output`` event (the rest follow in the next one).
MAX_LINES_PER_EVENT = 200

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _package_root() -> str:
    import hvd_magics

    return os.path.dirname(os.path.dirname(os.path.abspath(hvd_magics.__file__)))


def rank_environment(base: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The environment of a rank: the supervisor's, made unbuffered, plus the job's own."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_USE_LEGACY_KERAS", "1")
    root = _package_root()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    if env.pop(ENV_WANT_TIMELINE, None):
        # Only rank 0 writes it, on whichever host it runs; its supervisor sends it back.
        folder = os.path.join(tempfile.gettempdir(), "hvd_magics")
        os.makedirs(folder, exist_ok=True)
        env["HOROVOD_TIMELINE"] = os.path.join(folder, f"timeline-{uuid.uuid4().hex}.json")
    return env


class RankProcess:
    """One rank process and the threads that forward its output and events.

    Parameters
    ----------
    env : dict
        The complete environment of the rank (Horovod slot variables included).
    payload : bytes
        The cloudpickled ``(main, kwargs)``, written to the rank's stdin.
    sink : callable
        ``sink(kind, **payload)``; called with ``output`` (``lines``), the rank's own events
        (``started``, ``error``, ``result``, progress kinds) and finally ``exit`` (``code``).
    """

    def __init__(self, env: dict[str, str], payload: bytes, sink: EventSink) -> None:
        self._sink = sink
        read_fd, write_fd = os.pipe()
        env = dict(env)
        env[ENV_EVENT_FD] = str(write_fd)
        self._proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "hvd_magics.rank_main"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, pass_fds=(write_fd,), start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        os.close(write_fd)
        self.pid = self._proc.pid
        self._timeline = env.get("HOROVOD_TIMELINE")
        if self._timeline:
            sink("timeline_local", path=self._timeline)
        self._pumps = [
            threading.Thread(target=self._pump_output, name="hvd-rank-output", daemon=True),
            threading.Thread(target=self._pump_events, args=(read_fd,), name="hvd-rank-events",
                             daemon=True),
            threading.Thread(target=self._write_payload, args=(payload,), name="hvd-rank-stdin",
                             daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    def _write_payload(self, payload: bytes) -> None:
        try:
            self._proc.stdin.write(payload)
            self._proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def _pump_output(self) -> None:
        stdout = self._proc.stdout
        fd = stdout.fileno()
        pending = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for start in range(0, len(lines), MAX_LINES_PER_EVENT):
                batch = lines[start:start + MAX_LINES_PER_EVENT]
                self._sink("output", lines=[ln.decode(errors="replace") for ln in batch])
        if pending:
            self._sink("output", lines=[pending.decode(errors="replace")])

    def _pump_events(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as stream:
            for line in stream:
                try:
                    event: dict[str, Any] = json.loads(line)
                    kind = str(event.pop("kind"))
                except (ValueError, KeyError):
                    continue
                self._sink(kind, **event)

    def wait(self) -> int:
        """Wait for the rank to exit and its pipes to drain; send ``exit``; return the code."""
        code = self._proc.wait()
        for pump in self._pumps:
            pump.join(timeout=5)
        try:
            self._send_timeline()
        except OSError as exc:
            self._sink("output", lines=[f"hvd_magics: could not send the timeline: {exc}"])
        finally:
            self._sink("exit", code=code)
        return code

    def _send_timeline(self) -> None:
        """Send the trace this rank wrote (rank 0 only) in chunks, then delete the local file."""
        if not self._timeline or not os.path.exists(self._timeline):
            return
        with open(self._timeline, "rb") as fh:
            while chunk := fh.read(TIMELINE_CHUNK_BYTES):
                self._sink("timeline_chunk", data=base64.b64encode(chunk).decode())
        os.remove(self._timeline)

    def kill(self) -> None:
        """Kill the rank and every process it started (its process group)."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
