"""A job's options as the driver uses them: :class:`JobOptions`, checked once for
``HorovodRunner``, ``HorovodPool``, ``%%horovod`` and ``%hvd_pool`` alike.

Each option is declared once in :mod:`hvd_magics.option_table` (name, default, check, help, flags)
and each value is checked by :mod:`hvd_magics.option_checks`; what depends on two options (an
elastic ``np`` and ``restarts``, ``ranks_per_task`` that divides ``np``, a Horovod-only feature
on another engine) is checked here. The checks and the defaults can be imported from here too
(``from hvd_magics.options import validate_engine``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from hvd_magics.option_checks import (VERBOSITIES, VERBOSITY_ALL, VERBOSITY_DEBUG,
                                      VERBOSITY_LOG_CALLBACK_ONLY, ElasticSize, from_text,
                                      horovod_only, multiple_fix, positive_seconds, refuse_text,
                                      validate_checkpoint_dir, validate_engine, validate_env,
                                      validate_flag, validate_np, validate_ranks_per_task,
                                      validate_reset_limit, validate_restarts, validate_size,
                                      validate_verbosity)
from hvd_magics.option_table import (DEFAULT_ELASTIC_TIMEOUT_S, DEFAULT_IDLE_TIMEOUT_S,
                                     DEFAULT_START_TIMEOUT_S, RUNNER_OPTIONS, STALL_AFTER_S,
                                     check_all)
from hvd_magics.protocol import (ENGINE_HOROVOD, ENV_ENGINE, ENV_KEEP_STEPS, ENV_STALL_CHECK,
                                 ENV_TIMELINE_MARK_CYCLES, ENV_WANT_TIMELINE)

__all__ = [
    "DEFAULT_ELASTIC_TIMEOUT_S", "DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S",
    "STALL_AFTER_S", "VERBOSITIES", "VERBOSITY_ALL", "VERBOSITY_DEBUG",
    "VERBOSITY_LOG_CALLBACK_ONLY", "ElasticSize", "JobOptions", "from_text", "horovod_only",
    "multiple_fix", "positive_seconds", "refuse_text", "validate_checkpoint_dir",
    "validate_engine", "validate_env", "validate_flag", "validate_np", "validate_ranks_per_task",
    "validate_reset_limit", "validate_restarts", "validate_size", "validate_verbosity",
]


@dataclass(frozen=True)
class JobOptions:
    """A job's options as the driver uses them, checked once (:meth:`checked`) from
    :class:`hvd_magics.HorovodRunner`'s keywords or ``%%horovod``'s arguments, and carried as
    they are to the job's launch.

    ``ranks`` is how many ranks run (an elastic job's most), ``on_driver`` where: processes on
    the driver, or Spark tasks. ``env`` is the user's environment for the ranks; what the job
    itself sets there is :meth:`rank_env`.
    """

    ranks: int
    on_driver: bool = False
    elastic: ElasticSize | None = None
    engine: str = ENGINE_HOROVOD
    verbosity: str = VERBOSITY_ALL
    start_timeout: float = DEFAULT_START_TIMEOUT_S
    env: Mapping[str, str] = field(default_factory=dict)
    timeline: Path | None = None
    timeline_mark_cycles: bool = False
    mlflow: bool | str | None = None
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT_S
    reset_limit: int | None = None
    timeout: float | None = None
    stall_after: float = STALL_AFTER_S
    restarts: int = 0
    checkpoint_dir: str | None = None
    fresh: bool = False
    keep_steps: bool = False
    ranks_per_task: int | None = None

    @property
    def np(self) -> int:
        """HorovodRunner's ``np``: the number of ranks, negative on the driver."""
        return -self.ranks if self.on_driver else self.ranks

    @property
    def size(self) -> int | ElasticSize:
        """An elastic job's :class:`ElasticSize`, else :attr:`np`."""
        return self.elastic or self.np

    def rank_env(self) -> dict[str, str]:
        """The ranks' environment: the user's, the engine, Horovod's stall check (the stall
        time, unless the user set it), whether libraries keep every step, and the timeline's
        switches."""
        env = dict(self.env)
        if self.engine == ENGINE_HOROVOD:
            env.setdefault(ENV_STALL_CHECK, str(max(1, round(self.stall_after))))
        env[ENV_ENGINE] = self.engine
        if self.keep_steps:
            env[ENV_KEEP_STEPS] = "1"
        if self.timeline is not None:
            env[ENV_WANT_TIMELINE] = "1"
            if self.timeline_mark_cycles:
                env[ENV_TIMELINE_MARK_CYCLES] = "1"
        return env

    @classmethod
    def checked(cls, given: Mapping[str, Any], default_engine: str = ENGINE_HOROVOD,
                on_pool: bool = False) -> JobOptions:
        """Every option of ``given`` (HorovodRunner's keywords, by name; one left out takes
        its default) checked, alone and with the others: a ``ValueError`` names the option and
        the fix; ``default_engine`` and ``on_pool`` say what a warm pool the job runs on
        decides.

        Raises
        ------
        TypeError
            For a name that is not an option of a job, or no ``np``.
        ValueError
            For a wrong value, or two that do not go together.
        """
        value = check_all(given, RUNNER_OPTIONS)
        size = value["np"]
        elastic = size if isinstance(size, ElasticSize) else None
        per_task = validate_ranks_per_task(value["ranks_per_task"], size)
        validate_restarts(value["restarts"], elastic=elastic is not None, pool=on_pool)
        engine = default_engine if value["engine"] is None else value["engine"]
        if elastic is not None:
            horovod_only(f"an elastic job (np={given['np']})", engine,
                         "Fix: give a fixed np, or use engine='horovod' with hvd.elastic "
                         "(torch's elastic agent restarts every worker at each change, which "
                         "a notebook's job cannot follow).")
        if value["timeline"] is not None:
            horovod_only("the Horovod Timeline (timeline=, %hvd_timeline)", engine,
                         "Fix: record a trace with torch.profiler or tf.profiler in the job; "
                         "epoch timing, charts and %hvd_stacks work on every engine.")
        fixed = size.max_np if isinstance(size, ElasticSize) else size
        carried = {f.name: value[f.name] for f in dataclasses.fields(cls) if f.name in value}
        return cls(**{**carried, "ranks": abs(fixed), "on_driver": fixed < 0, "elastic": elastic,
                      "engine": engine, "verbosity": value["driver_log_verbosity"],
                      "ranks_per_task": per_task})
