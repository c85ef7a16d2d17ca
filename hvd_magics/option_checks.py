"""The checks of a job's options, one value at a time, for ``HorovodRunner``, ``HorovodPool``,
``%%horovod`` and ``%hvd_pool`` alike (which check goes with which option is declared once, in
:mod:`hvd_magics.option_table`).

Each check returns the value as it will be used, or raises ``ValueError`` with a message that
names the option and the fix (the magics turn it into a one-line ``UsageError``). An option
takes its value's own type: a number given as text (``restarts="1"``), a flag as text
(``fresh="no"``) or an environment that is not a dict of texts is refused, not converted. A
magic's line is text throughout: :func:`from_text` reads its numbers first.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from hvd_magics.protocol import ENGINE_HOROVOD, ENGINES

#: ``driver_log_verbosity`` values: HorovodRunner's two, and ``debug`` (framework chatter too).
VERBOSITY_ALL = "all"
VERBOSITY_LOG_CALLBACK_ONLY = "log_callback_only"
VERBOSITY_DEBUG = "debug"
VERBOSITIES = (VERBOSITY_ALL, VERBOSITY_LOG_CALLBACK_ONLY, VERBOSITY_DEBUG)


def from_text(text: Any) -> Any:
    """A value typed as text (a magic's line, an environment variable) as the int or float it
    spells (``"2"``, ``"-2"``, ``"1.5"``); other text (``"2:4"``, ``"abc"``) as it is, for the
    checks here to accept or refuse with the option's name; a value that is not text as it is."""
    if not isinstance(text, str):
        return text
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def refuse_text(value: Any, name: str) -> None:
    """Refuse text that spells a number (``restarts="1"``) for the option ``name`` (``"restarts
    (--restarts)"``): an option takes the number itself, as :func:`from_text` makes it of a
    magic's line."""
    if isinstance(value, str) and not isinstance(from_text(value), str):
        raise ValueError(f"{name} takes a number, not text: got {value!r}. "
                         f"Fix: {name.split()[0]}={from_text(value)!r}")


def validate_flag(value: Any, name: str) -> bool:
    """A switch: ``True`` or ``False`` only (``fresh="no"`` would be true if converted)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} takes True or False, got {value!r}. "
                         f"Fix: {name.split()[0]}=True")
    return value


#: How an environment for the ranks is given.
_ENV_FIX = "env={'FOO': '1'} (%%horovod --env FOO=1)"


def validate_env(env: Any) -> dict[str, str]:
    """The user's environment for the ranks: a mapping of variable names to texts (``None``:
    none); a value that is not text (``None`` would reach the ranks as ``"None"``) is refused,
    naming the variable."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ValueError(f"env takes a dict of variable names to values, got "
                         f"{type(env).__name__} {env!r}. Fix: {_ENV_FIX}")
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
            raise ValueError(f"env: {name!r} cannot name an environment variable. "
                             f"Fix: {_ENV_FIX}")
        if not isinstance(value, str):
            text = "'1'" if value is None else repr(str(value))
            raise ValueError(f"env[{name!r}] is {value!r}, and an environment variable's value "
                             f"is text. Fix: env={{{name!r}: {text}}}, or leave {name} out")
    return dict(env)


#: The sizes a job takes.
_NP_FIX = ("Fix: np=2 (two ranks as Spark tasks), np=-2 (two processes on the driver) or "
           "np='2:4' (an elastic job)")


def validate_np(np: Any) -> int:
    """``np`` as an int (``> 0``: Spark tasks, ``< 0``: processes on the driver)."""
    refuse_text(np, "np")
    if isinstance(np, bool) or not isinstance(np, int):
        raise ValueError(f"np must be a whole number of ranks, got {np!r}. {_NP_FIX}")
    if np == 0:
        raise ValueError("np=0 runs nothing: use np>0 for ranks as Spark tasks, "
                         "or np<0 for -np ranks on the driver")
    return np


def positive_seconds(seconds: Any, name: str) -> float:
    """``seconds`` as a positive float, or a ``ValueError`` naming the option ``name``."""
    refuse_text(seconds, name)
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(seconds, bool) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}. "
                         f"Fix: {name.split()[0]}=30, say")
    return value


def validate_verbosity(verbosity: Any) -> str:
    """One of :data:`VERBOSITIES`."""
    if verbosity not in VERBOSITIES:
        raise ValueError(f"driver_log_verbosity (--verbosity) must be one of "
                         f"{', '.join(VERBOSITIES)}, got {verbosity!r}. "
                         f"Fix: driver_log_verbosity={VERBOSITY_LOG_CALLBACK_ONLY!r} "
                         f"(--verbosity {VERBOSITY_LOG_CALLBACK_ONLY})")
    return verbosity


@dataclass(frozen=True)
class ElasticSize:
    """The size of an elastic job: it starts with at least ``min_np`` ranks, grows up to
    ``max_np`` and goes on while ``min_np`` remain."""

    min_np: int
    max_np: int

    def __str__(self) -> str:
        return f"{self.min_np}:{self.max_np}"


_ELASTIC_HINT = ("an elastic job takes MIN:MAX with 1 <= MIN <= MAX (np='2:4' or np=(2, 4)); "
                 "a fixed job takes one whole number")


def validate_size(np: Any) -> int | ElasticSize:
    """``np`` as a fixed size (see :func:`validate_np`) or an :class:`ElasticSize` (from
    ``"MIN:MAX"`` or ``(MIN, MAX)``)."""
    if isinstance(np, ElasticSize):
        return validate_size((np.min_np, np.max_np))
    if isinstance(np, str):
        text = np.strip()
        if ":" not in text:
            refuse_text(np, "np")
            raise ValueError(f"np must be a whole number of ranks or MIN:MAX, got {np!r}. "
                             f"{_NP_FIX}")
        low, _, high = text.partition(":")
        try:
            bounds: Any = (int(low), int(high))
        except ValueError:
            raise ValueError(f"np={np!r}: {_ELASTIC_HINT}") from None
    elif isinstance(np, (tuple, list)):
        bounds = tuple(np)
    else:
        return validate_np(np)
    if (len(bounds) != 2 or any(isinstance(b, bool) or not isinstance(b, int) for b in bounds)
            or not 1 <= bounds[0] <= bounds[1]):
        raise ValueError(f"np={np!r}: {_ELASTIC_HINT}")
    return ElasticSize(*bounds)


def validate_reset_limit(limit: Any) -> int | None:
    """The reset limit: ``None`` (no limit) or a whole number ``>= 0``."""
    if limit is None:
        return None
    refuse_text(limit, "reset_limit (--reset-limit)")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError("reset_limit (--reset-limit) must be a whole number >= 0 (how many "
                         f"times an elastic job may re-form), got {limit!r}. Fix: "
                         "reset_limit=3, say, or leave it out for no limit")
    return limit


#: How a checkpoint folder is given.
_CHECKPOINT_DIR_FIX = ("Fix: a folder's path (checkpoint_dir='/dbfs/checkpoints/run1', "
                       "--checkpoint-dir /dbfs/checkpoints/run1), or leave it out for one per "
                       "job under the temporary folder")


def validate_checkpoint_dir(folder: str | os.PathLike | None) -> str | None:
    """The checkpoint folder as given (``None``: one per job), as a path's text; refused when
    it names no folder (``""``) or no file system can name it."""
    if folder is None:
        return None
    if not isinstance(folder, (str, bytes, os.PathLike)):
        raise ValueError(f"checkpoint_dir (--checkpoint-dir) takes a folder's path, got "
                         f"{folder!r}. {_CHECKPOINT_DIR_FIX}")
    text = os.fspath(folder)
    if not text.strip():
        raise ValueError(f"checkpoint_dir (--checkpoint-dir) is {text!r}, which names no "
                         f"folder. {_CHECKPOINT_DIR_FIX}")
    if ("\x00" if isinstance(text, str) else b"\x00") in text:
        raise ValueError(f"checkpoint_dir (--checkpoint-dir) holds a NUL character, which no "
                         f"folder's name can: {text!r}. Fix: type the folder's path again")
    return text


def validate_restarts(restarts: Any, elastic: bool = False, pool: bool = False) -> int:
    """How many times a job may start again after a loss: a whole number ``>= 0``; refused with
    an elastic ``np`` (elastic Horovod goes on without the lost ranks instead) and on a warm
    pool (a lost rank is replaced at the pool's next cell)."""
    refuse_text(restarts, "restarts (--restarts)")
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise ValueError("restarts (--restarts) must be a whole number >= 0 (how many times a "
                         f"job starts again after losing a rank), got {restarts!r}. Fix: "
                         "restarts=1, say")
    if restarts and elastic:
        raise ValueError("restarts (--restarts) with an elastic np: an elastic job already goes "
                         "on when ranks are lost, as long as MIN remain. Fix: a fixed np with "
                         "restarts, or the elastic np without")
    if restarts and pool:
        raise ValueError("restarts (--restarts) on a warm pool: the pool replaces a lost rank "
                         "at its next cell. Fix: run the cell again, or a cold job (--cold) "
                         "with restarts")
    return restarts


def validate_engine(engine: Any) -> str:
    """One of :data:`hvd_magics.protocol.ENGINES` (a few other spellings are taken: ``ddp``,
    ``pytorch``, ``tensorflow``, ``hvd``)."""
    name = engine.strip().lower() if isinstance(engine, str) else engine
    aliases = {"hvd": "horovod", "pytorch": "torch", "ddp": "torch", "tensorflow": "tf"}
    name = aliases.get(name, name)
    if name not in ENGINES:
        raise ValueError(f"engine={engine!r} is not an engine: use 'horovod' (hvd.init()), "
                         "'torch' (torch.distributed.init_process_group(); FSDP, DeepSpeed, "
                         "Accelerate and Lightning run on it) or 'tf' "
                         "(tf.distribute.MultiWorkerMirroredStrategy())")
    return name


def horovod_only(feature: str, engine: str, instead: str) -> None:
    """Refuse a Horovod-only ``feature`` on another ``engine``, saying what to use ``instead``."""
    if engine != ENGINE_HOROVOD:
        raise ValueError(f"{feature} is Horovod's and this job runs on the {engine} engine. "
                         f"{instead}")


def multiple_fix(np: int, per_task: int) -> str:
    """The np values next to ``np`` that fill tasks of ``per_task`` ranks: ``"np=4 or np=6"``."""
    low = np - np % per_task
    return f"np={low} or np={low + per_task}" if low else f"np={per_task}"


def validate_ranks_per_task(ranks_per_task: Any, np: Any = None) -> int | None:
    """Rank processes per Spark task: ``None`` (one per GPU the session gives a task, else one)
    or a whole number ``>= 1`` that divides a fixed ``np > 0`` (``np`` as checked by
    :func:`validate_size`; ``None``: the number alone is checked)."""
    if ranks_per_task is None:
        return None
    refuse_text(ranks_per_task, "ranks_per_task (--ranks-per-task)")
    if isinstance(ranks_per_task, bool) or not isinstance(ranks_per_task, int) or \
            ranks_per_task < 1:
        raise ValueError("ranks_per_task (--ranks-per-task) must be a whole number >= 1 (rank "
                         f"processes in each Spark task), got {ranks_per_task!r}. Fix: "
                         "ranks_per_task=2, say, or leave it out")
    if ranks_per_task == 1 or np is None:
        return ranks_per_task
    if isinstance(np, ElasticSize):
        raise ValueError(f"ranks_per_task={ranks_per_task} with an elastic np={np}: an elastic "
                         "job gains and loses ranks one Spark task at a time. Fix: a fixed np, "
                         "or leave ranks_per_task out")
    if np < 0:
        raise ValueError(f"ranks_per_task={ranks_per_task} with np={np}: ranks on the driver "
                         "are a process each already (one per GPU). Fix: leave ranks_per_task "
                         f"out, or np={-np} for Spark tasks")
    if np % ranks_per_task:
        raise ValueError(f"np={np} is not a multiple of ranks_per_task={ranks_per_task}: every "
                         f"Spark task runs {ranks_per_task} ranks. Fix: "
                         f"{multiple_fix(np, ranks_per_task)}")
    return ranks_per_task


def optional_seconds(seconds: Any, name: str) -> float | None:
    """``None`` (no limit), else ``seconds`` as :func:`positive_seconds` checks them."""
    return None if seconds is None else positive_seconds(seconds, name)


def optional_path(path: str | os.PathLike | None) -> Path | None:
    """``None``, else ``path`` as a :class:`~pathlib.Path`."""
    return None if path is None else Path(path)
