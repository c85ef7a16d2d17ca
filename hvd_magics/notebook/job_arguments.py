"""The arguments ``%%horovod`` and ``%hvd_pool`` share, declared once (as ipyparallel's
``%px``, ``%%px`` and ``%pxconfig`` share theirs), each named as the
:class:`hvd_magics.HorovodRunner` keyword it becomes (:data:`RUNNER_KEYWORDS`)."""
from __future__ import annotations

import inspect
from typing import Any
from collections.abc import Callable

from hvd_magics.notebook.magic_line import option
from hvd_magics.options import DEFAULT_START_TIMEOUT_S, JobOptions, from_text

#: The keywords a job's options take (``HorovodRunner``'s, but ``np`` and ``pool``): a parsed
#: argument of this name goes to the runner as it is.
RUNNER_KEYWORDS = frozenset(inspect.signature(JobOptions.checked).parameters) - {
    "np", "default_engine", "on_pool"}


def ranks_arguments(prefix: str = "", engine: str | None = None
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--env``, ``--start-timeout``, ``--engine``, ``--ranks-per-task`` and ``--restarts``;
    ``prefix`` begins each help (``"start: "`` for the pool's action), ``engine`` is the
    default engine (``None``: the warm pool's, else Horovod)."""
    decorators = [
        option("--env", many=True, metavar="NAME=VALUE",
               help=f"{prefix}an environment variable for the ranks (repeat for more)."),
        option("--start-timeout", type=from_text, default=DEFAULT_START_TIMEOUT_S,
               metavar="SECONDS",
               help=f"{prefix}seconds to wait for every rank to start (default "
                    f"{DEFAULT_START_TIMEOUT_S:.0f})."),
        option("--engine", default=engine, metavar="ENGINE",
               help=f"{prefix}what the ranks run on: horovod (default; hvd.init()), torch "
                    "(torch.distributed.init_process_group() from the environment, as under "
                    "torchrun) or tf (tf.distribute.MultiWorkerMirroredStrategy() from "
                    "TF_CONFIG). engine=torch works too."),
        option("--ranks-per-task", type=from_text, default=None, metavar="K",
               help=f"{prefix}run K ranks in each Spark task (np/K tasks, ranks numbered "
                    "node by node; each task holds K CPUs). Default: one per GPU the "
                    "session gives a task (spark.task.resource.gpu.amount), else 1."),
        option("--restarts", type=from_text, default=0, metavar="N",
               help="start the job again when a rank or its executor is lost, up to N times; "
                    "it resumes from hvd_magics.checkpoint's latest (a rank's own error is "
                    "not retried). Not for a warm pool, which replaces a lost rank at its "
                    "next cell: run it cold (%%horovod --cold --restarts N)."),
    ]

    def apply(magic: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            magic = decorator(magic)
        return magic

    return apply


def runner_keywords(args: Any) -> dict[str, Any]:
    """The parsed arguments that are runner keywords, by name."""
    return {name: value for name, value in vars(args).items() if name in RUNNER_KEYWORDS}
