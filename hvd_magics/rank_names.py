"""How the notebook names a rank, written once: ``rank 1`` (``task 1`` in an elastic job, whose
Horovod ranks change at every reset while its Spark tasks stay), several of them (``ranks 0,
2``), and the tag in front of each of a rank's output lines (``[1]``, ``[task1]``, ``[1@host]``
when the ranks run on several hosts)."""
from __future__ import annotations

from collections.abc import Iterable

RANK, TASK = "rank", "task"


def unit_of(elastic: bool) -> str:
    """What a job's ranks are called: ``task`` in an elastic job, else ``rank``."""
    return TASK if elastic else RANK


def rank_named(rank: int, unit: str = RANK) -> str:
    """``rank 1`` (or ``task 1``)."""
    return f"{unit} {rank}"


def _spans(ranks: list[int], shortest: int) -> str:
    """``ranks`` in order, each run of consecutive ranks at least ``shortest`` long as a span."""
    words: list[str] = []
    start = 0
    for index in range(1, len(ranks) + 1):
        if index < len(ranks) and ranks[index] == ranks[index - 1] + 1:
            continue
        run = ranks[start:index]
        words += [f"{run[0]}-{run[-1]}"] if len(run) >= shortest else list(map(str, run))
        start = index
    return ", ".join(words)


def ranks_named(ranks: Iterable[int], unit: str = RANK) -> str:
    """``rank 1``, ``ranks 0, 2``, and a run of three or more as a span: ``ranks 0-62``
    (``task``/``tasks`` for an elastic job's). Given in order, said in order."""
    ranks = list(ranks)
    return f"{unit}{'s' if len(ranks) > 1 else ''} {_spans(ranks, 3)}"


def rank_spans(ranks: Iterable[int], unit: str = RANK) -> str:
    """``ranks 1-15``, ``ranks 1-2, 5``, ``rank 2``: runs as spans."""
    ranks = sorted(ranks)
    return f"{unit}{'s' if len(ranks) > 1 else ''} {_spans(ranks, 2)}"


def line_tag(rank: int, unit: str = RANK, host: str | None = None) -> str:
    """The tag of a rank's output line, as ``horovodrun`` tags them: ``[1]``, ``[task1]`` in an
    elastic job, with ``@host`` when the job's ranks run on more than one host."""
    who = f"{TASK}{rank}" if unit == TASK else str(rank)
    return f"[{who}@{host}]" if host else f"[{who}]"
