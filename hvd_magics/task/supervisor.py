"""Start one rank process and forward what it says, in order, to an event sink.

Used in two places: inside a Spark barrier task (the sink signs events and sends them to the driver)
and on the driver for ``np < 0`` (the sink puts them straight on the driver's queue). The rank runs
under a keeper process (:mod:`hvd_magics.common.process_group`): when the rank ends, its supervisor
dies, or :meth:`RankProcess.kill` is called, the rank's whole process group dies.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable

from hvd_magics.events import (CellEndEvent, Event, ExitEvent, OutputEvent, OutputPartialEvent,
                               TimelineChunkEvent, TimelineLocalEvent)
from hvd_magics.rank.instruments.cell_timeline import timeline_chunks
from hvd_magics.common.process_group import die_with_parent, killpg, same_process, start_time
from hvd_magics.common.rank_tmpdir import clean_rank_tmpdir, make_rank_tmpdir
from hvd_magics.task.output_reader import read_output
from hvd_magics.task.zygotes import ZYGOTES, ZygoteRank, package_copy
from hvd_magics.protocol import (CELL_END, CELL_END_LINE, ENV_CONTROL_FD, ENV_EVENT_FD,
                                 ENV_HOROVOD_TIMELINE, ENV_LEGACY_KERAS, ENV_PREIMPORT,
                                 ENV_RANK_PYTHON, ENV_RANK_TMPDIR, ENV_SUPERVISOR_PID,
                                 ENV_WANT_TIMELINE, EXIT, IMPORTED, OUTPUT, OUTPUT_PARTIAL,
                                 PREEMPT_LINE, RANK_MODULE, STARTED, TIMELINE_CHUNK,
                                 TIMELINE_LOCAL, encode_job, is_event)

#: The line a pool's rank prints at the end of each cell, as its output pipe carries it.
_CELL_END = CELL_END_LINE.encode()

#: ``sink(event)`` receives every event of the rank, from several threads.
RankSink = Callable[[Event], None]

#: Most lines sent in one ``output`` event (the rest follow in the next one).
MAX_LINES_PER_EVENT = 200
#: After the rank exited, how long its output may still be read (a process that left the rank's
#: process group could hold the pipe open).
OUTPUT_DRAIN_S = 5.0
#: After the rank exited, how long its events may still be read (a large result takes a while).
EVENTS_DRAIN_S = 600.0
#: Seconds :meth:`RankProcess.kill` waits for the keeper to go before tidying its folder.
KILL_WAIT_S = 5.0


def _keeper_dies_with_supervisor() -> None:  # runs in the child between fork and exec
    die_with_parent(signal.SIGTERM)  # the keeper then kills the rank's process group


def terminal_text(line: bytes) -> str:
    """A complete output line as a terminal shows it: after its last carriage return."""
    line = line.rstrip(b"\r")
    if b"\r" in line:
        line = line.rsplit(b"\r", 1)[1]
    return line.decode(errors="replace")


def _package_root() -> str:
    import hvd_magics

    return os.path.dirname(os.path.dirname(os.path.abspath(hvd_magics.__file__)))


def rank_environment(base: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The environment of a rank: the supervisor's, made unbuffered, plus the job's own, with
    the package first on ``PYTHONPATH`` (a zip that travelled to the executor: its host's copy)."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault(ENV_LEGACY_KERAS, "1")
    root = _package_root()
    if os.path.isfile(root):
        root = package_copy(root, {**env, **extra})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    if env.pop(ENV_WANT_TIMELINE, None):
        # Only rank 0 writes it, on whichever host it runs; its supervisor sends it back.
        folder = os.path.join(tempfile.gettempdir(), "hvd_magics")
        os.makedirs(folder, exist_ok=True)
        env[ENV_HOROVOD_TIMELINE] = os.path.join(folder, f"timeline-{uuid.uuid4().hex}.json")
    return env


class RankProcess:
    """One rank process and the threads that forward its output and events.

    Parameters
    ----------
    env : dict
        The environment of the rank (Horovod slot variables included).
    payload : bytes or None
        The cloudpickled ``(main, kwargs)``, written to the rank's stdin; ``None`` starts the
        process now (it imports what it will need) and :meth:`deliver` sends the job later.
    sink : callable
        ``sink(event)``; called with ``output`` (``lines``), the rank's own events
        (``started``, ``error``, ``result``, progress kinds), ``cell_end`` on a warm pool, and
        finally ``exit`` (``code``).
    pool : bool
        A warm pool's rank: its stdin stays open after the job, for :meth:`send_frame`.
    """

    #: A warm pool's rank (see ``pool``).
    _pool = False

    def __init__(self, env: dict[str, str], payload: bytes | None, sink: RankSink,
                 pool: bool = False) -> None:
        self._sink = sink
        self._pool = pool
        self._stdin_lock = threading.Lock()
        read_fd, write_fd = os.pipe()
        control_read, control_write = os.pipe()
        env = dict(env)
        env[ENV_EVENT_FD] = str(write_fd)
        env[ENV_CONTROL_FD] = str(control_read)
        env[ENV_SUPERVISOR_PID] = str(os.getpid())  # a forked rank is not its descendant
        #: The rank's private temporary folder, tidied when it ends (also when it is killed).
        self._tmpdir = make_rank_tmpdir()
        if self._tmpdir:
            env[ENV_RANK_TMPDIR] = self._tmpdir
        self._python = env.get(ENV_RANK_PYTHON) or sys.executable
        self._env = env
        self._preimport = env.get(ENV_PREIMPORT, "").split(",")
        forked = ZYGOTES.start_rank(self._python, env, self._preimport, write_fd, control_read)
        if forked is None:  # new pipes: a zygote that hung may hold the ends it was sent
            for fd in (read_fd, write_fd, control_read, control_write):
                os.close(fd)
            read_fd, write_fd = os.pipe()
            control_read, control_write = os.pipe()
            env[ENV_EVENT_FD], env[ENV_CONTROL_FD] = str(write_fd), str(control_read)
        self._proc: subprocess.Popen[bytes] | ZygoteRank = forked or subprocess.Popen(
            [self._python, "-u", "-m", RANK_MODULE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, pass_fds=(write_fd, control_read), start_new_session=True,
            preexec_fn=_keeper_dies_with_supervisor if sys.platform.startswith("linux") else None,
        )
        os.close(write_fd)
        os.close(control_read)
        self._control = os.fdopen(control_write, "wb", buffering=0)
        self._control_lock = threading.Lock()
        self.pid = self._proc.pid
        #: The rank's own pid (also its process group), known from its ``started`` event; the
        #: start times of the rank and the keeper (a pid given out again is not theirs).
        self.rank_pid: int | None = None
        #: Why this task killed the rank itself (:meth:`kill`), ``""`` while it did not.
        self.killed_because = ""
        self._rank_started: int | None = None
        self._keeper_started = start_time(self.pid)
        self._timeline = env.get(ENV_HOROVOD_TIMELINE)
        if self._timeline:
            sink(TimelineLocalEvent(kind=TIMELINE_LOCAL, path=self._timeline))
        self._pumps = [
            threading.Thread(target=self._pump_output, name="hvd-rank-output", daemon=True),
            threading.Thread(target=self._pump_events, args=(read_fd,), name="hvd-rank-events",
                             daemon=True),
        ]
        for pump in self._pumps:
            pump.start()
        if payload is not None:
            self.deliver(payload)

    def deliver(self, payload: bytes, late_env: dict[str, str] | None = None) -> None:
        """Send the job (and the environment only known now) to the waiting rank."""
        writer = threading.Thread(target=self._write_job, args=(payload, late_env or {}),
                                  name="hvd-rank-stdin", daemon=True)
        writer.start()
        self._pumps.append(writer)

    def _write_job(self, payload: bytes, late_env: dict[str, str]) -> None:
        self.send_frame(encode_job(payload, late_env))
        if not self._pool:
            self.end_input()

    def send_frame(self, frame: bytes) -> bool:
        """Write one stdin frame (a warm pool's next cell); ``False`` when the rank is gone."""
        with self._stdin_lock:
            stdin = self._proc.stdin
            assert stdin is not None  # a pipe: started with stdin=PIPE, or by a zygote
            try:
                stdin.write(frame)
                stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                return False
        return True

    def end_input(self) -> None:
        """Close the rank's stdin: a warm pool's rank then ends (after leaving Horovod)."""
        with self._stdin_lock:
            stdin = self._proc.stdin
            assert stdin is not None  # a pipe: started with stdin=PIPE, or by a zygote
            try:
                stdin.close()
            except (BrokenPipeError, OSError):
                pass

    def request_stacks(self, request: str) -> None:
        """Ask the rank for its stacks (:mod:`hvd_magics.rank.instruments.stack_report`): it
        answers with a ``stacks`` event carrying ``request``, without stopping what it runs."""
        self._control_line(request)

    def preempt(self, at: int, notice: str) -> None:
        """Tell the rank its executors are being taken away: ``checkpoint.preempting()`` is True
        from its call ``at`` on (:mod:`hvd_magics.rank.api.preemption`)."""
        self._control_line(PREEMPT_LINE + json.dumps({"at": at, "notice": notice}))

    def _control_line(self, line: str) -> None:
        with self._control_lock:
            try:
                self._control.write(line.encode() + b"\n")
            except (BrokenPipeError, OSError, ValueError):
                pass

    def interrupt(self) -> None:
        """Interrupt what the rank runs now (``SIGINT``: a ``KeyboardInterrupt`` in its cell)."""
        if self.rank_pid and self._rank_started is not None and \
                same_process(self.rank_pid, self._rank_started):
            try:
                os.kill(self.rank_pid, signal.SIGINT)
            except OSError:
                pass

    def _pump_output(self) -> None:
        """Forward the rank's output (:func:`~hvd_magics.task.output_reader.read_output`): its
        lines as ``output`` events, a progress bar's line still being drawn as
        ``output_partial``."""
        stdout = self._proc.stdout
        assert stdout is not None  # a pipe: started with stdout=PIPE, or by a zygote
        read_output(stdout.fileno(), self._send_lines,
                    lambda text: self._sink(OutputPartialEvent(kind=OUTPUT_PARTIAL, text=text)))

    def _send_lines(self, lines: list[bytes]) -> None:
        ends = [i for i, ln in enumerate(lines) if ln.endswith(_CELL_END)] if self._pool else []
        if ends:  # a cell ended: its lines (an unfinished last one too), then the word
            at = ends[0]
            unfinished = lines[at][:-len(_CELL_END)]
            self._send_lines(lines[:at] + ([unfinished] if unfinished else []))
            self._sink(CellEndEvent(kind=CELL_END))
            self._send_lines(lines[at + 1:])
            return
        for start in range(0, len(lines), MAX_LINES_PER_EVENT):
            batch = lines[start:start + MAX_LINES_PER_EVENT]
            self._sink(OutputEvent(kind=OUTPUT, lines=[terminal_text(ln) for ln in batch]))

    def _pump_events(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as stream:
            for line in stream:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict) or not is_event(event):
                    continue
                if event["kind"] == STARTED:
                    self.rank_pid = event.get("pid")
                    self._rank_started = start_time(self.rank_pid) if self.rank_pid else None
                if event["kind"] == IMPORTED:  # for this process's zygotes, not for the driver
                    ZYGOTES.learn(self._python, self._env, self._preimport,
                                  list(event.get("modules") or ()))
                    continue
                self._sink(event)

    def wait(self) -> int:
        """Wait for the rank to exit and its pipes to drain; send ``exit``; return the code.

        ``exit`` is always the rank's last event: it is sent after every event the rank wrote
        (its result included, however large) has been forwarded.
        """
        code = self._proc.wait()
        self._kill_rank_group()  # what the rank started dies with it
        with self._control_lock:
            self._control.close()
        clean_rank_tmpdir(self._tmpdir)
        output, events = self._pumps[:2]
        events.join(EVENTS_DRAIN_S)
        output.join(OUTPUT_DRAIN_S)
        try:
            self._send_timeline()
        except OSError as exc:
            self._sink(OutputEvent(kind=OUTPUT,
                                   lines=[f"hvd_magics: could not send the timeline: {exc}"]))
        finally:
            ended = ExitEvent(kind=EXIT, code=code)
            how = self.killed_because or self._keeper_said()
            if how:
                ended["how"] = how
            self._sink(ended)
        return code

    def _keeper_said(self) -> str:
        """How the rank ended when a zygote's keeper did not say its code (``""``: it did, or
        the keeper is this process's own child, whose exit status says it)."""
        return self._proc.how if isinstance(self._proc, ZygoteRank) else ""

    def _send_timeline(self) -> None:
        """Send the trace this rank wrote (rank 0 only) in chunks, then delete the local file."""
        if not self._timeline or not os.path.exists(self._timeline):
            return
        for data in timeline_chunks(self._timeline):
            self._sink(TimelineChunkEvent(kind=TIMELINE_CHUNK, data=data))
        os.remove(self._timeline)

    def _kill_rank_group(self) -> None:
        if self.rank_pid:
            killpg(self.rank_pid, self._rank_started)

    def kill(self, why: str = "") -> None:
        """Kill the rank, every process it started (its process group) and its keeper; ``why``,
        when given, is how its ``exit`` event says it ended (not as a signal of unknown
        origin)."""
        if why and not self.killed_because:
            self.killed_because = why
        self._kill_rank_group()
        killpg(self._proc.pid, self._keeper_started)
        try:
            self._proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            return  # wait() tidies up once it ends
        clean_rank_tmpdir(self._tmpdir)

