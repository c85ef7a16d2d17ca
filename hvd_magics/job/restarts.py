"""A job's checkpoints across its attempts: the folder each job gets (the same one when the same
job runs again), what every rank of an attempt agrees on (a mark of the attempt, the step they
resume from), where the next attempt resumes, and how a preempted job's error says to resume.

Whether an attempt is followed by another is the failure policy's
(:mod:`hvd_magics.job.failure_policy`); the controller runs them
(:mod:`hvd_magics.job.controller`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from hvd_magics.errors import CheckpointFolderUnusable
from hvd_magics.protocol import (ENV_ATTEMPT, ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_TOKEN,
                                 ENV_RESUME_STEP)
from hvd_magics.rank.api.checkpoint import NO_CHECKPOINT
from hvd_magics.common.checkpoints import latest_checkpoint
from hvd_magics.job.kept_memory import KeptJob, memory_step, resumed_from_memory

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


@dataclasses.dataclass(frozen=True)
class AttemptFacts:
    """What every rank of one attempt is told (:class:`hvd_magics.rank.rank_job.RankJob` reads
    it back): its number, the job's checkpoint folder, the mark of this attempt in it (a rank
    that does not share the driver's folder cannot find it), and the global step every rank
    resumes from (``"none"``: none)."""

    number: int
    folder: Path
    token: str
    resume_step: str
    #: The job's kept steps and the step the attempt resumes from memory (``None``: a file).
    kept: KeptJob | None = None
    memory_step: int | None = None

    def rank_env(self) -> dict[str, str]:
        """The ranks' environment variables that carry it (the only place they are set)."""
        kept = self.kept.rank_env(self.memory_step) if self.kept is not None else {}
        return {ENV_ATTEMPT: str(self.number), ENV_CHECKPOINT_DIR: str(self.folder),
                ENV_CHECKPOINT_TOKEN: self.token, ENV_RESUME_STEP: self.resume_step, **kept}


@contextlib.contextmanager
def attempt_checkpoints(folder: Path, number: int = 0,
                        kept: KeptJob | None = None) -> Iterator[AttemptFacts]:
    """What every rank of attempt ``number`` agrees on (:mod:`hvd_magics.rank.api.checkpoint`):
    a file of this attempt's in ``folder``, which a rank that does not share the driver's folder
    cannot find, and the step of the checkpoint they all resume from (the newest now). The file
    goes with the attempt, and the folder too when nothing else was written in it."""
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
    in_memory = memory_step(kept, found[0].global_step if found else None) if kept else None
    step = in_memory if in_memory is not None else found[0].global_step if found else None
    try:
        yield AttemptFacts(number, folder, token.name,
                           str(step) if step is not None else NO_CHECKPOINT, kept, in_memory)
    finally:
        token.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: no checkpoint was written


def resumes_from(folder: Path, kept: KeptJob | None = None) -> str:
    """Where the next attempt starts: the step kept in the hosts' memory when it is newest,
    else the step of the folder's latest checkpoint."""
    found = latest_checkpoint(folder)
    in_memory = memory_step(kept, found[0].global_step if found else None) if kept else None
    if kept is not None and in_memory is not None:
        return resumed_from_memory(kept, in_memory)
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
