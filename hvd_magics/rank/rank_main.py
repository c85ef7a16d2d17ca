"""Entry point of one rank process: ``python -m hvd_magics.rank.rank_main``.

The supervisor (:mod:`hvd_magics.task.supervisor`) writes the cloudpickled ``(main, kwargs)`` to
this process's stdin and reads structured events from the pipe named by ``HVD_MAGICS_EVENT_FD``.
This process needs no network access to the driver and holds no secret: the supervisor signs what it
forwards. The engine's own environment (Horovod's ``HOROVOD_RANK``, torch's ``MASTER_ADDR``,
``TF_CONFIG``, ...) is already set (:mod:`hvd_magics.task.engines`).

The process started by the supervisor is a small *keeper*: it forks the rank into a process group
of its own, waits for it, then kills that group, so whatever the user's code started dies with the
rank. When the supervisor dies (the kernel was killed, the executor was lost) the keeper gets
``SIGTERM`` and kills the group too. It exits as the rank did.

The rank's temporary folder is a private one (:mod:`hvd_magics.common.rank_tmpdir`): the supervisor
tidies it when the rank ends, the keeper when the supervisor is gone.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from typing import Any

from hvd_magics.errors import exception_text
from hvd_magics.events import ErrorEvent, ImportedEvent, LeavingEvent, ResultEvent, StartedEvent
from hvd_magics.protocol import (ENGINE_TF, ENV_CONTROL_FD, ERROR, IMPORTED, KEEPER_PARENT_GONE,
                                 KEEPER_STOPPED, KEEPER_TERMINATED, LEAVING, RESULT, STARTED,
                                 ZYGOTE_MODULES, decode_job)
from hvd_magics.rank import rank_events
from hvd_magics.rank.rank_job import rank_job
from hvd_magics.rank.leave_together import end_engine
from hvd_magics.common.process_group import die_with_parent, killpg
from hvd_magics.common.rank_tmpdir import clean_rank_tmpdir, use_tmpdir

#: Exit code of a rank whose keeper went away (the job was stopped).
ORPHANED_EXIT = 113


def _watch_parent(parent_pid: int) -> None:
    """Exit at once if the keeper dies (belt and braces beside PR_SET_PDEATHSIG)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(ORPHANED_EXIT)
        time.sleep(0.5)


def _format_exception(exc: BaseException) -> str:
    """The traceback, without the leading frames of hvd_magics itself (the user's code first)
    nor its wrappers between the user's call and the library's (the step split's around a
    collective showed twice in a survivor's ``dist.barrier()``); a last frame of ours stays
    where the error was raised there, not where it only called the wrapped ``original``."""
    package = os.path.dirname(os.path.abspath(__file__))
    ours = os.path.dirname(package) + os.sep

    def path(filename: str) -> str:
        # a cell's pseudo-file (``<%%horovod cell 3>``) is never ours, whatever the folder
        return "<" if filename.startswith("<") else os.path.abspath(filename)

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and os.path.dirname(
            path(tb.tb_frame.f_code.co_filename)) == package:
        tb = tb.tb_next
    try:
        report = traceback.TracebackException(type(exc), exc, tb)
        frames = list(report.stack)
        report.stack = traceback.StackSummary.from_list(
            [frame for i, frame in enumerate(frames)
             if not path(frame.filename).startswith(ours)
             or (i == len(frames) - 1 and "original(" not in (frame.line or ""))])
        return "".join(report.format())
    except Exception:  # noqa: BLE001
        return f"{type(exc).__name__}: {exception_text(exc)}\n"


def final_rank() -> int:
    """This process's Horovod rank at the end of the job: an elastic job's ranks may have been
    renumbered since the process started (``HVD_MAGICS_RANK`` is the first one)."""
    for name in ("horovod.torch", "horovod.tensorflow"):
        module = sys.modules.get(name)
        try:
            if module is not None and module.is_initialized():
                return int(module.rank())
        except Exception:  # noqa: BLE001,S112 - fall back to the environment
            continue
    return rank_job().rank


def report_error(exc: BaseException) -> None:
    """Send the driver ``exc`` with its traceback (the user's frames first), after the output."""
    sys.stdout.flush()
    sys.stderr.flush()
    rank_events.emit(ErrorEvent(kind=ERROR, error=type(exc).__name__,
                                message=exception_text(exc)[:2000],
                                traceback=_format_exception(exc)))


def report_imports() -> None:
    """Tell the supervisor which frameworks of :data:`ZYGOTE_MODULES` the job imported (the
    next rank of this environment may then start from a zygote that has them)."""
    rank_events.emit(ImportedEvent(kind=IMPORTED, modules=[
        name for name in ZYGOTE_MODULES if name in sys.modules]))


def _fail(exc: BaseException, code: int = 1) -> None:
    report_imports()
    report_error(exc)
    rank_events.close()
    os._exit(code)


def _preimport(names: tuple[str, ...]) -> None:
    """Import the job's leading imports while the launch goes on (what fails is left for the
    job itself to fail on, with its own traceback)."""
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001,S112 - the job imports it again and reports it
            continue


def run_job(payload: bytes) -> tuple[Any, BaseException | None, int]:
    """Run one shipped ``(main, kwargs)``: ``(parts, None, 0)`` with rank 0's encoded value
    (``None`` on other ranks, unless the job asked for every rank's), or ``(None, exception, exit
    code)`` when it failed.
    ``sys.exit(0)`` is a successful end."""
    import cloudpickle

    from hvd_magics.rank import hooks
    from hvd_magics.result_codec import encode_parts

    hooks.new_job()  # a warm pool's cell counts its own steps
    try:
        main_fn, kwargs = cloudpickle.loads(payload)
        try:
            value = main_fn(**kwargs)
            saving = sys.modules.get("hvd_magics.rank.api.checkpoint")
            if saving is not None:
                saving.wait()  # a save in the background is in place before the rank ends
        finally:
            hooks.job_ended()
    except SystemExit as exc:
        if exc.code not in (0, None):
            return None, exc, exc.code if isinstance(exc.code, int) else 1
        value = None
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the driver
        return None, exc, 1
    try:
        every = rank_job().every_result
        if every or final_rank() == 0:
            return encode_parts(value), None, 0
        if _tf_distribute_worker():
            encode_parts(value)  # the same collectives as rank 0's pickling, which waits for them
        return None, None, 0
    except BaseException as exc:  # noqa: BLE001
        return None, exc, 1


def _tf_distribute_worker() -> bool:
    """Whether this rank is a ``tf.distribute`` worker (the ``tf`` engine): pickling its value
    may read a strategy's variables (a Keras ``History`` holds the model; a variable synced on
    read, a metric's, is read by an all-reduce of every worker), so every worker pickles it,
    or rank 0 alone would wait in that collective for ever."""
    return rank_job().engine == ENGINE_TF and "tensorflow" in sys.modules


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """Write a warning as one line, ``path:line: Category: message`` (its message's lines
    joined), which the driver knows as a warning (:mod:`hvd_magics.job.readings.output_lines`)."""
    text = " ".join(str(message).split("\n"))
    try:
        (file or sys.stderr).write(f"{filename}:{lineno}: {category.__name__}: {text}\n")
    except (OSError, ValueError):
        pass


def run_rank() -> None:
    """Run the shipped function and report its result or its exception (never returns)."""
    from hvd_magics.rank import hooks

    hooks.install_writes()
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    hooks.serve_stacks()
    warnings.showwarning = show_warning
    hooks.install()
    _preimport(rank_job().preimport)
    late_env, payload = decode_job(sys.stdin.buffer) or ({}, b"")
    os.environ.update(late_env)
    rank_events.emit(StartedEvent(kind=STARTED, pid=os.getpid()))
    parts, failure, code = run_job(payload)
    if failure is not None:
        _fail(failure, code)
    report_imports()
    rank_events.emit(LeavingEvent(kind=LEAVING, steps=hooks.ddp_steps()))
    end_engine()
    sys.stdout.flush()
    sys.stderr.flush()
    rank_events.emit(ResultEvent(kind=RESULT, parts=parts))
    rank_events.close()
    # Skip interpreter teardown: atexit hooks of frameworks can block when a peer is gone.
    os._exit(0)


def _exit_like(status: int) -> None:
    """Exit the way a child with wait status ``status`` did."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 1)


def keep(child: int, tmpdir: str | None = None, report: socket.socket | None = None) -> None:
    """The keeper: wait for the rank ``child``, kill its process group, exit as it did; stopped
    (its supervisor is gone), it also tidies the rank's temporary folder ``tmpdir``.

    A keeper a zygote forked (:mod:`hvd_magics.rank.zygote`) is not its supervisor's child:
    it writes ``exit CODE`` to ``report`` for the supervisor, and stops when the supervisor
    closes its end."""
    reaped = False
    parent = os.getppid()

    def stop(_sig: int, _frame: object) -> None:
        if not reaped:  # once reaped, its pid may be another process's
            killpg(child)
        if report is not None:  # its supervisor learns why (unless it is the one gone)
            why = (KEEPER_PARENT_GONE if os.getppid() != parent else KEEPER_TERMINATED)
            with contextlib.suppress(OSError):
                report.sendall(f"{KEEPER_STOPPED} {why}\n".encode())
        clean_rank_tmpdir(tmpdir)
        os._exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() == 1:  # the supervisor died before PR_SET_PDEATHSIG was set
        stop(signal.SIGTERM, None)
    if report is not None:
        threading.Thread(target=_stop_when_closed, args=(report,), daemon=True).start()
    # its group killed before it is reaped: until then its pid, which names the group, is
    # nobody else's
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)
    killpg(child)
    _, status = os.waitpid(child, 0)
    reaped = True
    if report is not None:
        with contextlib.suppress(OSError):
            report.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    _exit_like(status)


def _stop_when_closed(report: socket.socket) -> None:
    """The keeper's watch on its supervisor's socket: closed, the keeper stops (as
    ``PR_SET_PDEATHSIG`` stops a keeper the supervisor started itself)."""
    with contextlib.suppress(OSError):
        while report.recv(64):
            pass
    os.kill(os.getpid(), signal.SIGTERM)


def _close_control_fd() -> None:
    fd = os.environ.get(ENV_CONTROL_FD)
    if fd:
        with contextlib.suppress(OSError):
            os.close(int(fd))


def _fresh_random_state() -> None:
    """Seed the global generators a fork would share with its siblings again (numpy's and
    torch's, when a zygote imported them; Python's ``random`` does it itself after a fork), so
    that a rank draws what a fresh process would."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def main(report: socket.socket | None = None) -> None:
    """Fork the rank into its own process group and keep it (``report``: see :func:`keep`)."""
    keeper = os.getpid()
    tmpdir = rank_job().tmpdir
    child = os.fork()
    if child == 0:
        if report is not None:
            report.close()
        if tmpdir:
            use_tmpdir(tmpdir)
        os.setpgid(0, 0)
        die_with_parent()
        if os.getppid() != keeper:
            os._exit(ORPHANED_EXIT)
        _fresh_random_state()
        run_rank()
    else:
        try:
            os.setpgid(child, child)  # also from this side: no race with killpg(child)
        except OSError:
            pass
        os.close(0)  # the payload is the rank's to read
        _close_control_fd()  # and so are the stack requests
        keep(child, tmpdir, report)


if __name__ == "__main__":
    main()
