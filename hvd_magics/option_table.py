"""Every option of a job, declared once: its name (``HorovodRunner``'s keyword), type, default,
check, help, the magics' flags, whether ``HorovodPool`` takes it and ``HorovodEstimator``'s param
for it.

Made from it: :meth:`hvd_magics.options.JobOptions.checked`'s names and checks, the arguments of
``%%horovod`` and ``%hvd_pool start`` (:mod:`hvd_magics.notebook.job_arguments`) and the
estimator's defaults (:mod:`hvd_magics.estimator.params`). ``HorovodRunner`` and ``HorovodPool``
write their keywords out for their users (``help()``, an editor's hints);
``tests/unit/test_option_declarations.py`` fails when they, the magics or the estimator drift
from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Mapping

from hvd_magics.option_checks import (VERBOSITIES, VERBOSITY_ALL, optional_path,
                                      optional_seconds, positive_seconds,
                                      validate_checkpoint_dir, validate_engine, validate_env,
                                      validate_flag, validate_ranks_per_task,
                                      validate_reset_limit, validate_restarts, validate_size,
                                      validate_verbosity)

#: Default seconds to wait for every rank process to start (Spark scheduling included; a job
#: that reads DataFrames counts from when they reached its tasks, and an environment the
#: executors unpack is allowed for besides). The estimator's ``startTimeout`` too: it had 600
#: of its own, for no reason its fits have that other jobs reading DataFrames lack.
DEFAULT_START_TIMEOUT_S = 120.0
#: Default seconds of silence after which a rank is shown as stalled, with where it is.
STALL_AFTER_S = 60.0
#: Horovod's default: how long an elastic job may have fewer than its minimum of ranks.
DEFAULT_ELASTIC_TIMEOUT_S = 600.0
#: A pool with no cell for this long ends and gives its slots back (``--idle-timeout``).
DEFAULT_IDLE_TIMEOUT_S = 1800.0


class _Required:
    """The default of an option every caller gives (``np``)."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of an option that ``HorovodRunner`` and ``HorovodPool`` need given; the magics and
#: the estimator leave it ``None`` (the pool's, every task slot).
REQUIRED: Any = _Required()

#: How a magic reads an option's value from its line: a number (``from_text``: ``2``, ``-2``,
#: ``1.5``, other text for the check to refuse), text, nothing (a switch: given is ``True``),
#: text given again and again (a list), or text or nothing (nothing is ``True``).
NUMBER, TEXT, SWITCH, TEXTS, MAYBE_TEXT = "number", "text", "switch", "texts", "maybe text"

#: A check: the value as given and how messages name the option, to the value as it is used.
Check = Callable[[Any, str], Any]


def _alone(check: Callable[[Any], Any]) -> Check:
    """A check whose messages name their option themselves."""
    return lambda value, label: check(value)


def _as_given(value: Any, label: str) -> Any:  # noqa: ARG001 - what a Check takes
    """No check here (``mlflow``: whether MLflow is there is the run's to say)."""
    return value


@dataclass(frozen=True)
class Option:
    """One option of a job, declared once.

    Parameters
    ----------
    name : str
        ``HorovodRunner``'s and ``HorovodPool``'s keyword, the key of
        :meth:`~hvd_magics.options.JobOptions.checked` and the magic's ``dest``.
    type : str
        The keyword's annotation, as the runner and the pool write it.
    default : object
        The keyword's default (:data:`REQUIRED`: none); where a front end may leave the option
        out (a magic, the estimator) its :attr:`unset`.
    check : callable
        ``check(value, label)``: the value as used, or a ``ValueError`` naming the option.
    help : str
        ``%%horovod``'s help.
    flags : tuple of str
        The magics' flags (``()``: none, the option is set another way).
    reads : str
        How a magic reads the flag's value (:data:`NUMBER`, :data:`TEXT`, ...).
    metavar : str, optional
        The value's name in the magic's usage.
    runner : bool
        A keyword of ``HorovodRunner`` (and a flag of ``%%horovod`` when it has flags).
    pool : bool
        A keyword of ``HorovodPool`` (and a flag of ``%hvd_pool start``).
    pool_help : str, optional
        ``%hvd_pool``'s help (default: ``start:`` and :attr:`help`).
    param : str, optional
        The ``HorovodEstimator`` param of this option (``None``: it has none).
    """

    name: str
    type: str
    default: Any
    check: Check
    help: str
    flags: tuple[str, ...] = ()
    reads: str = TEXT
    metavar: str | None = None
    runner: bool = True
    pool: bool = False
    pool_help: str | None = None
    param: str | None = None

    @property
    def label(self) -> str:
        """How a message names the option: ``start_timeout (--start-timeout)``."""
        return f"{self.name} ({self.flags[-1]})" if self.flags else self.name

    @property
    def unset(self) -> Any:
        """The value where a front end leaves the option out: its default, ``None`` for a
        required one (the magic's ``np``: the pool's; the estimator's: every task slot)."""
        return None if self.default is REQUIRED else self.default

    @property
    def pool_magic_help(self) -> str:
        """``%hvd_pool``'s help of the option."""
        return self.pool_help or f"start: {self.help}"

    def checked(self, value: Any) -> Any:
        """``value`` as the job uses it; ``ValueError`` names the option and the fix."""
        return self.check(value, self.label)


#: Every option, in ``HorovodRunner``'s order of keywords (its positional order too).
OPTIONS: tuple[Option, ...] = (
    Option("np", "int", REQUIRED, _alone(validate_size),
           "Number of ranks: N>0 runs N Spark tasks, N<0 runs -N processes on the driver, "
           "MIN:MAX runs an elastic job (hvd.elastic). HorovodRunner style np=N works too. "
           "Without it (or with the pool's own N) the cell runs on the warm pool of "
           "%%hvd_pool start.", ("-np", "--np"), NUMBER, pool=True,
           pool_help="start: number of ranks (N>0 Spark tasks held by the pool, N<0 processes "
                     "on the driver); np=N works too.", param="np"),
    Option("driver_log_verbosity", "str", VERBOSITY_ALL, _alone(validate_verbosity),
           "'all' shows every rank's output; 'log_callback_only' only log_to_driver(); "
           "'debug' the frameworks' start-up chatter too.", ("--verbosity",),
           metavar="{" + ",".join(VERBOSITIES) + "}"),
    Option("start_timeout", "float", DEFAULT_START_TIMEOUT_S, positive_seconds,
           f"seconds to wait for every rank to start (default {DEFAULT_START_TIMEOUT_S:.0f}).",
           ("--start-timeout",), NUMBER, "SECONDS", pool=True, param="startTimeout"),
    Option("env", "Mapping[str, str] | None", None, _alone(validate_env),
           "an environment variable for the ranks (repeat for more).", ("--env",), TEXTS,
           "NAME=VALUE", pool=True),
    # set by %hvd_timeline on, not on a magic's line
    Option("timeline", "str | os.PathLike | None", None, _alone(optional_path),
           "Record Horovod Timeline into this file on the driver."),
    Option("timeline_mark_cycles", "bool", False, validate_flag,
           "Mark Horovod's cycles in the timeline."),
    Option("mlflow", "bool | str | None", None, _as_given,
           "Record the run in MLflow (in EXPERIMENT, or the current experiment). Runs are also "
           "recorded when an MLflow run is active or %%hvd_mlflow is on.", ("--mlflow",),
           MAYBE_TEXT, "EXPERIMENT", param="mlflow"),
    Option("elastic_timeout", "float", DEFAULT_ELASTIC_TIMEOUT_S, positive_seconds,
           "Elastic jobs: stop when fewer than MIN ranks are left for this long "
           f"(default {DEFAULT_ELASTIC_TIMEOUT_S:.0f}).", ("--elastic-timeout",), NUMBER,
           "SECONDS"),
    Option("reset_limit", "int | None", None, _alone(validate_reset_limit),
           "Elastic jobs: stop when the ranks would re-form more than N times.",
           ("--reset-limit",), NUMBER, "N"),
    Option("timeout", "float | None", None, optional_seconds,
           "Stop the job after SECONDS; the error says where each rank was.", ("--timeout",),
           NUMBER, "SECONDS"),
    Option("stall_after", "float", STALL_AFTER_S, positive_seconds,
           "Show a rank silent this long as stalled, with the line it is in "
           f"(default {STALL_AFTER_S:.0f}).", ("--stall-after",), NUMBER, "SECONDS"),
    # None: the warm pool's engine for a job on a pool, else Horovod
    Option("engine", "str | None", None,
           _alone(lambda engine: None if engine is None else validate_engine(engine)),
           "what the ranks run on: horovod (default; hvd.init()), torch "
           "(torch.distributed.init_process_group() from the environment, as under torchrun) "
           "or tf (tf.distribute.MultiWorkerMirroredStrategy() from TF_CONFIG). engine=torch "
           "works too.", ("--engine",), metavar="ENGINE", pool=True),
    # the cross checks (an elastic np, a warm pool) are JobOptions.checked's and HorovodPool's
    Option("restarts", "int", 0, _alone(validate_restarts),
           "start the job again when a rank or its executor is lost, up to N times; it "
           "resumes from hvd_magics.checkpoint's latest (a rank's own error is not retried). "
           "Not for a warm pool, which replaces a lost rank at its next cell: run it cold "
           "(%%horovod --cold --restarts N).", ("--restarts",), NUMBER, "N", pool=True,
           pool_help="start: only 0: a warm pool replaces a lost rank at its next cell; a job "
                     "that must go on after a loss runs cold (%%horovod --cold --restarts N).",
           param="restarts"),
    Option("checkpoint_dir", "str | os.PathLike | None", None, _alone(validate_checkpoint_dir),
           "The job's checkpoint folder (default: one per cell, under the driver's temporary "
           "folder; on a cluster, a folder every executor shares).", ("--checkpoint-dir",),
           metavar="DIR", pool=True,
           pool_help="start: the folder that holds the checkpoint folders of the pool's cells, "
                     "one per cell (default: the driver's temporary folder; on a cluster, give "
                     "a folder every executor shares). A cell's own --checkpoint-dir is its "
                     "folder."),
    Option("fresh", "bool", False, validate_flag,
           "Remove the job's checkpoints first: start over.", ("--fresh",), SWITCH),
    Option("keep_steps", "bool", False, validate_flag,
           "Keep every training step in the hosts' memory where Lightning's Trainer trains, "
           "with no line added: a rank killed without notice costs at most one step, and "
           "--restarts resumes there (a loop of your own calls hvd_magics.checkpoint.keep).",
           ("--keep-steps",), SWITCH),
    # whether it divides np is JobOptions.checked's and HorovodPool's to say
    Option("ranks_per_task", "int | None", None, _alone(validate_ranks_per_task),
           "run K ranks in each Spark task (np/K tasks, ranks numbered node by node; each "
           "task holds K CPUs). Default: one per GPU the session gives a task "
           "(spark.task.resource.gpu.amount), else 1.", ("--ranks-per-task",), NUMBER, "K",
           pool=True),
    Option("idle_timeout", "float", DEFAULT_IDLE_TIMEOUT_S, positive_seconds,
           "end the pool (and free its slots) after this long without a cell "
           f"(default {DEFAULT_IDLE_TIMEOUT_S:.0f}).", ("--idle-timeout",), NUMBER, "SECONDS",
           runner=False, pool=True),
)

#: ``HorovodRunner``'s options (and ``%%horovod``'s, those with flags), in its order.
RUNNER_OPTIONS = tuple(option for option in OPTIONS if option.runner)
#: ``HorovodPool``'s options (and ``%hvd_pool start``'s).
POOL_OPTIONS = tuple(option for option in OPTIONS if option.pool)


def declared(arguments: Mapping[str, Any], options: tuple[Option, ...]) -> dict[str, Any]:
    """The values of ``options`` among ``arguments`` (a constructor's ``locals()`` on entry,
    which hold every keyword it declares: a missing one is a ``KeyError``)."""
    return {option.name: arguments[option.name] for option in options}


def check_all(given: Mapping[str, Any], options: tuple[Option, ...]) -> dict[str, Any]:
    """Each of ``options`` checked alone, in their declared order: ``given``'s value, else its
    default.

    Raises
    ------
    TypeError
        For a name ``given`` that is none of ``options``, or a required one left out.
    ValueError
        For a wrong value, naming the option and the fix.
    """
    names = {option.name for option in options}
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(f"{unknown[0]!r} is not an option of a job: the options are "
                        f"{', '.join(sorted(names))}")
    values: dict[str, Any] = {}
    for option in options:
        value = given.get(option.name, option.default)
        if value is REQUIRED:
            raise TypeError(f"{option.name} is required")
        values[option.name] = option.checked(value)
    return values


def estimator_defaults() -> dict[str, Any]:
    """The defaults of ``HorovodEstimator``'s params that are job options, by param name."""
    return {option.param: option.unset for option in OPTIONS if option.param is not None}
