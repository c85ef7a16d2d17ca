"""A job that survives a lost rank or executor: started again on a new stage, up to ``restarts``
times, each attempt told its number and the job's checkpoint folder
(:mod:`hvd_magics.rank.api.checkpoint`), so that it resumes from the last checkpoint.

Only a loss is retried: a rank that died without a Python exception (killed, its executor lost)
or that failed in the collective library because a peer went away (Gloo or NCCL connection
errors, Horovod's "has been shut down"). A rank's own exception (a ``ValueError``, a shape
error) fails the job at once, as without restarts: running it again gives the same error.

An attempt that ended on a preemption notice (every rank saved and raised ``Preempted``:
:mod:`hvd_magics.rank.api.preemption`) starts again too, from the checkpoint it saved, and does not
count against ``restarts``: at most ``HVD_MAGICS_MAX_PREEMPTIONS`` (10) of them per job. Without
``restarts`` it ends with an error that names the checkpoint and how to resume.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
import time
from datetime import datetime
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from hvd_magics.errors import (CheckpointFolderUnusable, HorovodJobError, JobInterrupted,
                               NotEnoughSlotsError, Preempted)
from hvd_magics.job.job_state import LOST
from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.launch_request import LaunchRequest
from hvd_magics.notices import say
from hvd_magics.protocol import (ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_TOKEN,
                                 ENV_MAX_PREEMPTIONS, ENV_RESUME_STEP)
from hvd_magics.rank.api.checkpoint import NO_CHECKPOINT
from hvd_magics.common.checkpoints import latest_checkpoint

#: What a rank's error says when a peer of it went away (the loss is elsewhere).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
             "has been shut down", "DistBackendError", "NCCL", "Gloo", "gloo",
             "HorovodInternalError", "Socket Timeout", "connection refused")
#: Errors a job's Spark stage ends with when an executor went away.
EXECUTOR_LOST = ("an executor was lost", "ExecutorLostFailure", "was lost")
#: How many attempts of a job may end on a preemption notice (they do not count against
#: ``restarts``), unless ``HVD_MAGICS_MAX_PREEMPTIONS`` says otherwise.
MAX_PREEMPTIONS = 10


def job_name(source: str | None, kwargs: dict) -> str | None:
    """What names a function's job: its source and its arguments (the same function with other
    arguments is another job, with checkpoints of its own)."""
    if source is None:
        return None
    return source + "\n" + repr(sorted(kwargs.items()))


def checkpoint_folder(name: str | None, given: str | None, root: str | None = None) -> Path:
    """The job's checkpoint folder: ``given``, else one per job ``name`` (a cell's text, a
    function's source and arguments) under ``root`` (a warm pool's ``checkpoint_dir``) or the
    system's temporary folder, so that the same job finds it again after the notebook
    restarted; a job without a name gets a folder of its own (it resumes only across its own
    restarts). A relative folder is the notebook's (a rank's working folder is its executor's).
    """
    if given is not None:
        return Path(given).expanduser().absolute()
    key = hashlib.sha256(name.encode()).hexdigest()[:12] if name else \
        f"job-{uuid.uuid4().hex[:12]}"
    if root is not None:
        return Path(root).expanduser().absolute() / key
    return Path(tempfile.gettempdir()) / "hvd_magics" / "checkpoints" / key


def loss(exc: HorovodJobError) -> str | None:
    """The cause, in one line, when ``exc`` is a loss that a restart can get past; else ``None``.

    A loss: every failed rank died without a Python exception, failed in the collective
    library or stopped on a preemption notice (at least one died), or the stage lost an
    executor before any rank reported."""
    failures = exc.failures
    if not failures:
        return exc.summary.splitlines()[0] if any(m in exc.summary for m in EXECUTOR_LOST) \
            else None
    died = [f for f in failures if not f.error or f.error == LOST]  # killed, executor lost
    peers = [f for f in failures if f.error and any(
        m in f"{f.error}: {f.message}\n{f.traceback}" for m in PEER_LOST)]
    stopped = [f for f in failures if f.error == Preempted.__name__]  # at a notice, on purpose
    if not died or len(died) + len(peers) + len(stopped) < len(failures):
        return None
    return died[0].headline()


def preempted(exc: HorovodJobError) -> str | None:
    """What rank 0 said when the attempt ended on a preemption notice (rank 0, which writes the
    checkpoint, raised ``Preempted`` once it was written, and every other failed rank did too,
    or died, or lost a peer: the executor may be gone before its rank reported); else ``None``.

    Rank 0's word only: another rank raises ``Preempted`` as soon as its part is done, before
    rank 0 has written anything, so a rank 0 lost during its save was an attempt told as
    "the checkpoint of step 56 was saved" and "resumes from step 56" while the next one resumed
    from step 40, the last whole checkpoint. Such an attempt is a loss."""
    saved = [f for f in exc.failures if f.error == Preempted.__name__ and f.rank == 0]
    if not saved:
        return None
    for failure in exc.failures:
        text = f"{failure.error}: {failure.message}\n{failure.traceback}"
        if failure.error not in ("", LOST, Preempted.__name__) and not any(
                m in text for m in PEER_LOST):
            return None
    return min(saved, key=lambda f: f.rank).message


def _max_preemptions() -> int:
    try:
        return max(0, int(os.environ.get(ENV_MAX_PREEMPTIONS, MAX_PREEMPTIONS)))
    except ValueError:
        return MAX_PREEMPTIONS


@dataclasses.dataclass(frozen=True)
class ResumeFix:
    """How a preempted job's error tells the user to resume: ``again`` (run it again, where its
    checkpoint is) and ``restarts`` (the setting that resumes by itself)."""

    again: str
    restarts: str


def _resume_from(folder: Path) -> str:
    return f"to resume from that checkpoint in {folder} (checkpoint.latest() gives it to the ranks)"


def job_resume_fix(folder: Path) -> ResumeFix:
    """A job's own: its checkpoint folder, ``--restarts N``."""
    return ResumeFix(f"Run it again {_resume_from(folder)}",
                     "give --restarts N (HorovodRunner(restarts=N)) to resume by itself")


def pool_resume_fix(folder: Path) -> ResumeFix:
    """A warm pool's cell's: its ranks were restarted away from the executor going (their
    variables are gone), and a pool refuses ``restarts``."""
    return ResumeFix("The warm pool's ranks were restarted away from it, so their variables "
                     "are gone: run the cells that set them up again, then this one, "
                     + _resume_from(folder),
                     "run it cold with --restarts N (%%horovod --cold --restarts N, "
                     "HorovodRunner(np, restarts=N)) to resume by itself")


def launch_with_restarts(request: LaunchRequest, launch: Callable[[LaunchRequest], RunRecord],
                         restarts: int, folder: Path, fresh: bool,
                         resume_fix: ResumeFix | None = None) -> RunRecord:
    """Run ``launch(request)`` and, after a loss, again (``restarts`` times at most), each
    attempt with its number and the checkpoint folder in the ranks' environment; a preempted
    job without ``restarts`` ends with ``resume_fix`` (default: :func:`job_resume_fix`).

    A failed attempt's record comes on its error (``exc.record``); the last one's tells every
    attempt when they are used up."""
    fix = resume_fix or job_resume_fix(folder)
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    found = latest_checkpoint(folder)
    if found is not None:
        written = time.strftime("%H:%M:%S", time.localtime(found[1].stat().st_mtime))
        say(f"the job's checkpoints in {folder} hold step {found[0].global_step:,} (written "
            f"at {written}): checkpoint.latest() gives it to the ranks (--fresh starts over)")
    causes: list[str] = []
    attempt = losses = preemptions = 0
    run_id: str | None = None  # the attempts' one MLflow run, once the first created it
    epochs: list[dict[str, Any]] = []  # the epochs the earlier attempts timed
    last: RunRecord | None = None  # the record of the latest attempt that failed
    began = datetime.now()
    while True:
        env = {**request.env, ENV_ATTEMPT: str(attempt), ENV_CHECKPOINT_DIR: str(folder)}
        # a restart waits for the cluster to replace the executor it lost, up to start_timeout
        wait: dict[str, Any] = {"slot_wait_s": request.start_timeout} if attempt else {}
        try:
            with attempt_checkpoints(folder) as agreed:
                record = launch(dataclasses.replace(request, env={**env, **agreed},
                                                    attempt=attempt,
                                                    earlier_attempts=tuple(causes),
                                                    mlflow_run_id=run_id, **wait))
        except JobInterrupted:
            raise
        except NotEnoughSlotsError as exc:  # a later attempt, or a job with a checkpoint
            kept = latest_checkpoint(folder)
            if not attempt and kept is None:
                raise
            last = exc.record if exc.record is not None else last
            if causes and last is not None:
                last.attempts = [*causes, f"not started: {exc}"]
            what = (f"The job's checkpoint of step {kept[0].global_step:,} in {folder} stays: "
                    f"{fix.again}, once the cluster has the task slots" if kept else
                    f"No checkpoint was written in {folder}")
            raise NotEnoughSlotsError(f"{exc}\n{what}.") from None
        except KeyboardInterrupt:  # before its ranks started (waiting for task slots, say)
            what = f"attempt {attempt + 1} of the job" if attempt else "the job"
            raise JobInterrupted(f"interrupted while {what} was being set up, before any of its "
                                 f"ranks started: nothing is left running") from None
        except HorovodJobError as exc:
            notice = preempted(exc)
            if notice is not None:
                preemptions += 1
                if not restarts or preemptions > _max_preemptions():
                    why = (fix.restarts if not restarts else f"{preemptions - 1} preemptions "
                           f"were resumed already, the most {ENV_MAX_PREEMPTIONS} allows")
                    raise HorovodJobError(f"The job was preempted: {notice}. {fix.again}, or "
                                          f"{why}.", log_path=exc.log_path) from None
                attempt += 1
                resume = resumes_after_preemption(folder, notice)
                causes.append(f"preempted: {notice} (ended {time.strftime('%H:%M:%S')}; "
                              f"attempt {attempt + 1} {resume})")
                say(f"attempt {attempt} ended on a preemption notice: {notice}; starting "
                    f"attempt {attempt + 1}, which {resume} (preemptions do not count against "
                    f"restarts)")
                continue
            cause = loss(exc)
            if cause is None or not restarts:
                raise
            last = exc.record if exc.record is not None else last
            run_id = run_id or getattr(last, "mlflow_run_id", None)
            epochs = one_timing(epochs, getattr(last, "epochs", []))
            ended = time.strftime("%H:%M:%S")
            if losses >= restarts:
                causes.append(f"{cause} (ended {ended})")
                if last is not None:  # the record tells every attempt
                    last.attempts, last.started_at = list(causes), began
                exc.add_summary(f"the job was started {attempt + 1} times, and each ended with "
                                "a loss: " + "; ".join(f"attempt {i + 1}: {c}"
                                                      for i, c in enumerate(causes)))
                raise
            attempt += 1
            losses += 1
            try:
                resume = resumes_from(folder)
                causes.append(f"{cause} (ended {ended}; attempt {attempt + 1} {resume})")
                say(f"attempt {attempt} of {restarts + 1} ended: {cause}; starting attempt "
                    f"{attempt + 1}, which {resume} in {folder}")
            except KeyboardInterrupt:
                raise JobInterrupted(
                    f"interrupted after attempt {attempt} ended ({cause}), before attempt "
                    f"{attempt + 1} started; nothing is left running") from None
            continue
        if causes:  # the record tells the attempts; the wall time and epochs are all theirs
            record.attempts, record.started_at = [*causes, "succeeded"], began
            record.epochs = one_timing(epochs, record.epochs)
        return record


@contextlib.contextmanager
def attempt_checkpoints(folder: Path) -> Iterator[dict[str, str]]:
    """What every rank of one attempt agrees on (:mod:`hvd_magics.rank.api.checkpoint`): a file of
    this attempt's in ``folder``, which a rank that does not share the driver's folder cannot
    find, and the step of the checkpoint they all resume from (the newest now). The file goes
    with the attempt, and the folder too when nothing else was written in it."""
    token = folder / f".hvd_magics-attempt-{uuid.uuid4().hex[:12]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        token.write_text("the driver's mark: ranks that see it share this folder\n")
    except (FileExistsError, NotADirectoryError) as exc:
        raise CheckpointFolderUnusable(
            f"the job's checkpoint folder {folder} cannot be made: {exc.filename or folder} is "
            f"a file. Fix: name a folder with %%horovod --checkpoint-dir DIR "
            f"(HorovodRunner(checkpoint_dir=DIR)), one every executor shares") from None
    except OSError as exc:
        raise CheckpointFolderUnusable(
            f"the job's checkpoint folder {folder} is not writable from the notebook "
            f"({type(exc).__name__}: {exc.strerror or exc}). Fix: name a folder you may write "
            f"in with %%horovod --checkpoint-dir DIR (HorovodRunner(checkpoint_dir=DIR)), one "
            f"every executor shares") from None
    found = latest_checkpoint(folder)
    try:
        yield {ENV_CHECKPOINT_TOKEN: token.name,
               ENV_RESUME_STEP: str(found[0].global_step) if found else NO_CHECKPOINT}
    finally:
        token.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: no checkpoint was written


def resumes_from(folder: Path) -> str:
    """Where the next attempt starts: the step of the folder's latest checkpoint."""
    found = latest_checkpoint(folder)
    return (f"resumes from the checkpoint of step {found[0].global_step:,}" if found is not None
            else "starts over (no checkpoint was written)")


def resumes_after_preemption(folder: Path, notice: str) -> str:
    """Where the attempt after a preemption starts: the checkpoint the ranks saved on the
    notice (``notice`` names its step), in the job's folder or in the library's own (a
    ``Trainer``'s ``output_dir``)."""
    saved = re.search(r"checkpoint of step ([\d,]+)", notice)
    found = latest_checkpoint(folder)
    if saved is None or (found is not None and
                         f"{found[0].global_step:,}" == saved.group(1)):
        return resumes_from(folder)
    return f"resumes from the checkpoint of step {saved.group(1)} (where the job's code saved it)"


def one_timing(earlier: list[dict[str, Any]], later: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The epoch timing of two attempts as one run: the earlier attempt's epochs up to where
    the later one began (an epoch both ran is the later one's row)."""
    began = min((row["epoch"] for row in later), default=None)
    kept = [row for row in earlier if began is None or row["epoch"] < began]
    return kept + list(later)
