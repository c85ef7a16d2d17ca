"""Errors a user sees. Remote failures read like local ones: one error, one labelled block per
rank."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hvd_magics.causes import AttemptCause, RankCause, attempt_cause, rank_cause
from hvd_magics.rank_names import rank_named

#: The command that builds Horovod for the environment it runs in (:mod:`hvd_magics.horovod`).
HOROVOD_BUILD_COMMAND = "python -m hvd_magics.horovod build"
#: How many failed ranks an error shows in full (the rest are only named).
MAX_RANKS_SHOWN = 4
#: How many of a failed rank's last output lines an error shows.
OUTPUT_TAIL_LINES = 20


def sentence(text: str) -> str:
    """``text`` ended as a sentence: with one full stop, unless it ends with one already (or
    with ``!``, ``?``), so that a message composed of another's words (an exception's, a
    library's: ``f"{sentence(said)} Fix: ..."``) never says ``..``; trailing blanks go."""
    text = text.rstrip()
    return text if not text or text.endswith((".", "!", "?")) else f"{text}."


class HorovodMagicsError(Exception):
    """Base of every error hvd_magics raises (but :class:`JobInterrupted`, a
    ``KeyboardInterrupt``): catch it to catch them all.

    Its message says what went wrong and the fix, so IPython shows that line, not a traceback
    through hvd_magics (subclasses with more to show render more).

    ``record`` is the record (:class:`hvd_magics.job.records.run_record.RunRecord`) of the job the
    error ended, once the driver finished it; ``None`` for an error raised before a job began.
    """

    record: Any = None

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class HorovodMagicsWarning(UserWarning):
    """A warning of hvd_magics' own about the user's code (a library asked for what it does not
    do on these ranks), issued at the user's line; the cell shows it whole, where a library's
    long warning is cut (:mod:`hvd_magics.job.readings.output_lines`)."""


class CellError(HorovodMagicsError, ValueError):
    """The cell cannot run on the ranks as written (the message names the line and the fix)."""


class ResultDecodeError(HorovodMagicsError, ValueError):
    """A value rank 0 sent back cannot be brought into the notebook."""


@dataclass
class RankFailure:
    """What one failed rank left behind."""

    rank: int
    host: str
    exit_code: int | None
    error: str = ""
    message: str = ""
    traceback: str = ""
    output_tail: list[str] = field(default_factory=list)
    #: What ``rank`` counts: ``"rank"``, or ``"task"`` in an elastic job (whose ranks change).
    unit: str = "rank"
    #: How it ended when its exit code is not known for sure (its keeper went silent).
    exit_how: str = ""
    #: Whether its host stopped answering (its link or machine was lost).
    host_lost: bool = False
    #: Whether ``error`` was read from the C++ runtime's last words (an uncaught native
    #: exception aborted it): it died without a Python exception, a cause as any death's.
    native: bool = False

    @property
    def cause(self) -> RankCause:
        """Why it failed (:func:`hvd_magics.causes.rank_cause`)."""
        return rank_cause("" if self.native else self.error, self.message, self.traceback,
                          self.host_lost)

    def place(self) -> str:
        """Which rank and where: ``rank 1 on host``."""
        who = f"{self.unit} {self.rank}"
        return f"{who} on {self.host}" if self.host else who

    def headline(self) -> str:
        """One line: which rank, where, and what happened."""
        where = self.place()
        if self.error:
            return f"{where}: {self.error}: {self.message}".rstrip(": ")
        if self.exit_how:
            return f"{where}: {self.exit_how}, without a Python exception"
        if self.exit_code is not None and self.exit_code < 0:
            return f"{where}: killed by signal {-self.exit_code} without a Python exception"
        if self.exit_code is not None:
            return f"{where}: exited with code {self.exit_code} without a Python exception"
        return f"{where}: did not finish"


class HorovodJobError(HorovodMagicsError, RuntimeError):
    """A Horovod job failed: one or more ranks raised, died, or never started.

    Attributes
    ----------
    failures : list of RankFailure
        One entry per failed rank, first failure first.
    log_path : str
        The file on the driver that holds every line every rank wrote.
    cause : AttemptCause, optional
        Why the attempt ended, when its failed ranks do not say it (a Spark stage that lost an
        executor before any rank reported); by default judged from ``failures``.
    """

    def __init__(self, summary: str, failures: list[RankFailure] | None = None,
                 log_path: str = "", cause: AttemptCause | None = None) -> None:
        self.summary = summary
        self.failures = failures or []
        self.log_path = log_path
        self._cause = cause
        super().__init__(self._text())

    @property
    def cause(self) -> AttemptCause:
        """Why the attempt ended (:func:`hvd_magics.causes.attempt_cause`): what a job's
        failure policy decides on."""
        if self._cause is not None:
            return self._cause
        return attempt_cause([(f.rank, f.cause) for f in self.failures])

    def add_summary(self, text: str) -> None:
        """Say one more thing after the summary (the pool restarted its ranks, say)."""
        self.summary = f"{sentence(self.summary)} {text[0].upper()}{text[1:]}"
        self.args = (self._text(),)

    def _repeats(self, index: int) -> RankFailure | None:
        """The earlier failure that failed as failure ``index`` did (same error and message),
        so that one error is said once, not once per rank."""
        failure = self.failures[index]
        if not failure.error:
            return None
        return next((f for f in self.failures[:index]
                     if (f.error, f.message) == (failure.error, failure.message)), None)

    def _line(self, index: int) -> str | None:
        """Failure ``index``'s line, or ``None`` when the summary already says it."""
        failure = self.failures[index]
        if index == 0 and failure.headline() in self.summary:  # its fix may follow it there
            return None
        if self._repeats(index) is not None:
            return f"{failure.place()}: the same {failure.error}"
        return failure.headline()

    def _text(self) -> str:
        lines = [self.summary]
        lines += [f"  {line}" for line in map(self._line, range(min(len(self.failures),
                                                                    MAX_RANKS_SHOWN)))
                  if line is not None]
        if len(self.failures) > MAX_RANKS_SHOWN:
            lines.append(f"  ... and {len(self.failures) - MAX_RANKS_SHOWN} more ranks")
        if self.log_path:
            lines.append(f"  full logs: {self.log_path}")
        return "\n".join(lines)

    def raise_exception(self, index: int = 0) -> None:
        """Raise failed rank ``index``'s own exception (the first failure by default), as a
        local one of its type, so that ``except ValueError`` around a job can work (as
        ipyparallel's ``CompositeError.raise_exception``).

        The exception is made anew from its type and message: a built-in type, or one whose
        module the notebook has imported (``horovod``'s, your own). Its ``__cause__`` is this
        error, whose traceback is the rank's.

        Raises
        ------
        Exception
            The rank's exception, or this error itself when its type cannot be made here (a
            rank that died without one, a type the notebook has not imported).
        """
        failure = self.failures[index]
        kind = _exception_type(failure)
        try:
            exc = kind(failure.message) if kind is not None else None
        except Exception:  # noqa: BLE001 - a type that wants other arguments
            exc = None
        if exc is None:
            raise self
        raise exc from self

    def _header(self) -> str:
        """The summary, less the first rank's message when its traceback, shown next, ends with
        it (said once)."""
        first = self.failures[0] if self.failures else None
        if first is None or not self.summary.endswith(first.headline()):
            return self.summary
        trace = first.traceback.rstrip().splitlines()
        if not trace or not trace[-1].endswith(f"{first.error}: {first.message}"):
            return self.summary
        return (f"{self.summary[:-len(first.headline())]}{first.place()}: {first.error} "
                "(its traceback below)")

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a driver-side traceback: each failed rank's own."""
        out = [f"{type(self).__name__}: {self._header()}"]
        for index, failure in enumerate(self.failures[:MAX_RANKS_SHOWN]):
            label = f"[{rank_named(failure.rank)}]"
            line = self._line(index)
            out.append(f"\n{label} {line}" if line is not None else "")
            # a repeated error's traceback is the first one's again
            trace = failure.traceback.rstrip().splitlines() if self._repeats(index) is None \
                else []
            out += [f"{label} {ln}" for ln in trace]
            if failure.output_tail:
                out.append(f"{label} last {len(failure.output_tail)} lines of output:")
                out += [f"{label}   {ln}" for ln in failure.output_tail]
        if len(self.failures) > MAX_RANKS_SHOWN:
            rest = ", ".join(str(f.rank) for f in self.failures[MAX_RANKS_SHOWN:])
            out.append(f"\n... ranks {rest} failed too (see the logs)")
        if self.log_path:
            out.append(f"\nfull logs of every rank: {self.log_path}")
        return out


def _exception_type(failure: RankFailure) -> type | None:
    """The exception class a rank raised, when it can be found here without importing: a
    built-in, or from a module already imported (its name from the traceback's last line)."""
    import builtins
    import sys

    kind = getattr(builtins, failure.error, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind
    last = failure.traceback.rstrip().rsplit("\n", 1)[-1]
    qualified = last.split(":", 1)[0].strip()
    module, _, name = qualified.rpartition(".")
    if name != failure.error or module not in sys.modules:
        return None
    kind = getattr(sys.modules[module], name, None)
    return kind if isinstance(kind, type) and issubclass(kind, Exception) else None


class JobInterrupted(KeyboardInterrupt):
    """The user interrupted a job (Ctrl-C, the kernel's stop button); every rank was stopped.

    A ``KeyboardInterrupt``, so code that catches interrupts still does; IPython shows its one
    line instead of a traceback through hvd_magics.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class Preempted(BaseException):
    """Raised on every rank by ``checkpoint.save`` once it saved on a preemption notice
    (``checkpoint.preempting()``): it ends the attempt on purpose, on every rank at the same
    step; the driver starts the next attempt from that checkpoint (a ``BaseException``, so that
    a loop's ``except Exception`` does not keep training)."""


class StartTimeoutError(HorovodJobError):
    """Not every rank started within the start timeout."""

    @property
    def cause(self) -> AttemptCause:
        return AttemptCause.START_TIMEOUT


class JobTimeoutError(HorovodJobError):
    """The job ran past its ``timeout`` and was stopped; the message says where each rank was."""


class NotEnoughSlotsError(HorovodMagicsError, ValueError):
    """The Spark cluster has fewer free task slots than the job has ranks."""


class EncryptionRequired(HorovodMagicsError, RuntimeError):
    """The Spark session asks for TLS (``spark.ssl.enabled=true``), which the ranks' training
    traffic (Horovod's, Gloo's, NCCL's) does not have; the message names the setting that
    allows it anyway (pyspark's ``TorchDistributor`` refuses the same, with the same setting)."""


class SparkSessionLost(HorovodMagicsError, RuntimeError):
    """The SparkSession cannot reach its Spark Connect server (stopped, lost, or restarted so
    that it no longer knows the session); the message says how to get a new session."""


class ShardError(HorovodMagicsError, TypeError):
    """On a rank: a shard's column cannot become the arrays training code asks for (the message
    names it)."""


class ShardSpaceError(HorovodMagicsError, OSError):
    """In a Spark task: a shard does not fit on the executor's local disk (the message has the
    figures)."""


class MlflowMissing(HorovodMagicsError, ImportError):
    """Tracking was asked for, but mlflow is not installed (the message says how to get it)."""


class PoolError(HorovodMagicsError, RuntimeError):
    """A warm pool cannot take the work: it has ended, or runs another cell (the message says
    what to do)."""


class PayloadError(HorovodMagicsError, TypeError):
    """Something the job needs cannot be pickled and shipped to the ranks."""


class DataRefused(PayloadError, HorovodJobError):
    """The rows of the job's DataFrames reached the tasks and were refused before any rank got
    the job: a rank would get none, or a column that must hold no nulls holds some (the message
    says which and the fix). Both a :class:`PayloadError` and a :class:`HorovodJobError`."""


class EstimatorInputError(HorovodMagicsError, ValueError):
    """A :class:`~hvd_magics.estimator.HorovodEstimator` cannot train on this DataFrame or with
    these params (the message names the column or param and the fix)."""


class EnvironmentNotShippable(HorovodMagicsError, ValueError):
    """The notebook's environment cannot be shipped to the executors: not a venv or conda
    environment, an editable install that cannot travel, or larger than the limit."""


class ShardedStateRefused(HorovodMagicsError, TypeError):
    """``checkpoint.save`` was given sharded tensors (FSDP's DTensors, ShardedTensors), which
    rank 0 alone cannot write whole."""


class KeepRefused(HorovodMagicsError, TypeError):
    """``checkpoint.keep`` was given what it cannot copy into the hosts' memory (sharded tensors,
    a DeepSpeed engine, a value pickle refuses); the message says what to do instead."""


class KeptStepUnreachable(HorovodMagicsError, OSError):
    """The step an attempt resumes from was kept in the hosts' memory, and neither this host nor
    any keeper that held it has it now (the next attempt resumes from a file)."""


class ShardedCheckpointNeedsState(HorovodMagicsError, TypeError):
    """A sharded checkpoint is read into the job's state: ``checkpoint.latest()`` was called
    without it (the message says how to give it)."""


class CheckpointMismatch(HorovodMagicsError, ValueError):
    """A sharded checkpoint does not fit the state it is read into (another model, or another
    shape of it)."""


class CheckpointDiskFull(HorovodMagicsError, OSError):
    """The disk (or quota) of the job's checkpoint folder filled while a checkpoint was written:
    the partly written step was removed, the checkpoints before it stay whole."""


class CheckpointFolderUnusable(HorovodMagicsError, OSError):
    """The job's checkpoint folder is a file, or a folder the driver may not write in."""


class CheckpointFolderNotShared(HorovodMagicsError, OSError):
    """A rank does not see the job's checkpoint folder as the driver does: each executor would
    keep checkpoints of its own, and ranks would resume from different steps."""


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, also for an exception whose ``__str__`` raises."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        return f"<{type(exc).__name__} whose message could not be turned into text>"
