"""Horovod's stall reports in the ranks' output, read for the one case the driver acts on.

Rank 0's stall inspector prints, when collectives have waited longer than
``HOROVOD_STALL_CHECK_TIME_SECONDS``::

    [... stall_inspector.cc:107] One or more tensors were submitted to be reduced, gathered ...
    Missing ranks:
    0: [hvd_magics_finished]
    1: [allreduce.noname.3]

``N: [names]`` lists the tensors rank ``N`` has not submitted. Every rank submits
:data:`~hvd_magics.protocol.END_TENSOR` once its function returned, so a report that has a rank
missing it names the ranks still at work (and, under the finished ranks, the collectives they wait
in): a finished rank will never submit those, and the job cannot end well. Such a report becomes
an :class:`EarlyFinish`; the lines of any stall report are kept out of the cell (the log file has
them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from hvd_magics.protocol import END_TENSOR

_HEADER = re.compile(r"One or more tensors were submitted to be reduced, gathered or broadcasted "
                     r"by subset of ranks")
_MISSING = re.compile(r"^Missing ranks:\s*$")
_ENTRY = re.compile(r"^(\d+)!?: \[(.*)\]\s*$")


@dataclass
class EarlyFinish:
    """Ranks that finished while others still wait for them in a collective."""

    finished: list[int]
    waiting: dict[int, list[str]]

    def message(self) -> str:
        """The job's error: who finished, who waits in what, and the fix."""
        done = _ranks(self.finished)
        tensors = sorted({name for names in self.waiting.values() for name in names})
        shown = ", ".join(repr(t) for t in tensors[:3]) + (" ..." if len(tensors) > 3 else "")
        return (f"{done} finished (its function returned) while {_ranks(sorted(self.waiting))} "
                f"still waited for it in a Horovod collective ({shown}). A collective needs "
                "every rank, and a rank that has finished never submits it, so the job was "
                "stopped instead of handing out a result without it. Fix: have every rank run "
                "the same collectives (the same number of steps and epochs; "
                "Shard.steps_per_epoch gives every rank the same count), or call hvd.join() "
                "where a rank runs out of data (Horovod then lets the others go on, adding "
                "zeros in its place).")


@dataclass
class StallReports:
    """Reads every rank's output lines for stall reports (one per rank at a time)."""

    size: int
    _entries: dict[int, dict[int, list[str]]] = field(default_factory=dict)
    _in_report: dict[int, bool] = field(default_factory=dict)
    early_finish: EarlyFinish | None = None

    def feed(self, rank: int, line: str) -> bool:
        """Read one line of ``rank``; return whether it belongs to a stall report."""
        if _HEADER.search(line):
            self._in_report[rank] = True
            self._entries[rank] = {}
            return True
        if not self._in_report.get(rank):
            return False
        entry = _ENTRY.match(line)
        if _MISSING.match(line) or entry:
            if entry:
                names = [n.strip() for n in entry.group(2).split(",") if n.strip() != "..."]
                self._entries[rank][int(entry.group(1))] = names
                self._judge(self._entries[rank])
            return True
        self._in_report[rank] = False
        return False

    def _judge(self, missing: dict[int, list[str]]) -> None:
        if self.early_finish is not None:
            return
        at_work = {r for r, names in missing.items() if any(END_TENSOR in n for n in names)}
        waiting_on_finished = {r: [n for n in names if END_TENSOR not in n]
                               for r, names in missing.items() if r not in at_work}
        waits = {r for r, names in waiting_on_finished.items() if names}
        if not at_work or not waits:
            return
        finished = sorted(set(range(self.size)) - at_work)
        tensors = sorted({n for names in waiting_on_finished.values() for n in names})
        self.early_finish = EarlyFinish(finished, {r: tensors for r in sorted(at_work)})


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks))
