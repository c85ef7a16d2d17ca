"""Ranks that can never meet again: a peer waiting, alone, in a collective the finished ranks
will never enter, and every rank stalled in a collective of another name than a peer's.

Horovod's own check (our patch) says so within seconds on the Horovod engine; Gloo under
``torch.distributed`` and tf.distribute's collectives wait for the missing peer forever.
"""
from __future__ import annotations

from hvd_magics.errors import HorovodJobError
from hvd_magics.job.job_state import JobState
from hvd_magics.job.readings.stacks import DDP_ALLREDUCE, collective_waited
from hvd_magics.job.readings.stacks import where as stack_where
from hvd_magics.job.verdicts.notice import stuck_in_the_save
from hvd_magics.job.following import collect_stacks
from hvd_magics.job.verdicts.monitor import Turn
from hvd_magics.rank_names import rank_named, ranks_named

#: After a rank finished the job's code, how long a peer may wait in a collective before its
#: stacks are taken; one found in the same collective twice this far apart waits for a
#: collective the finished rank will never enter (the ranks made different calls).
LEFT_BEHIND_S = 2.0
#: What the ranks did wrong when their collectives do not meet.
UNEVEN_DDP_FIX = ("The ranks took different numbers of training steps (most often: uneven data "
                  "per rank). Fix: give every rank the same number of batches "
                  "(DistributedSampler(dataset, drop_last=True), or shards of equal rows), or "
                  "run the loop inside DDP's join context (with model.join(): ...), which lets "
                  "ranks run out of data at different steps.")
UNEVEN_FIX = ("The ranks made different collective calls (a different number of them, or in "
              "another order). Fix: have every rank make the same collective calls in the same "
              "order.")


class LeftBehind:
    """Ranks finished the job's code (or ended on a preemption notice) while a peer waits in a
    collective they will never enter, found in the same place twice :data:`LEFT_BEHIND_S`
    apart."""

    def __init__(self) -> None:
        self.asked: float | None = None
        self.waiting: dict[int, tuple[str, int | None]] = {}

    while_failing = False  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        verdict = self.verdict(turn)
        return None if verdict is None else HorovodJobError(verdict,
                                                            log_path=str(turn.job.log_path))

    def verdict(self, turn: Turn) -> str | None:
        job, now = turn.job, turn.now
        noticed = job.ended_on_notice()
        finished = sorted({*job.finished_ranks(), *noticed})
        running = [r for r in job.running_ranks() if r not in finished]
        if not finished or not running:
            self.asked, self.waiting = None, {}
            return None
        if self.asked is None:
            self.asked = now
        if now - self.asked < LEFT_BEHIND_S:
            return None
        self.asked = now
        stacks = collect_stacks(job, turn.backend, turn.events)
        waits = {rank: collective_waited(stacks.ranks[rank]) for rank in running
                 if rank in stacks.ranks}
        waiting = {rank: (stack_where(stacks.ranks[rank].get("threads", [])),
                          (stacks.ranks[rank].get("ddp") or {}).get("steps"))
                   for rank, engine in waits.items() if engine}
        stuck = {rank: at for rank, at in waiting.items() if self.waiting.get(rank) == at}
        self.waiting = waiting
        if not stuck:
            return None
        engine = waits[min(stuck)]
        at = "; ".join(f"{rank_named(rank, job.unit)} in {where}"
                       for rank, (where, _steps) in sorted(stuck.items()))
        if noticed:
            return stuck_in_the_save(job, noticed, sorted(stuck), f"a {engine} collective", at)
        if engine == DDP_ALLREDUCE:
            return _uneven_steps(job, finished, stuck, at)
        return (f"{ranks_named(sorted(stuck), job.unit)} "
                f"{'wait' if len(stuck) > 1 else 'waits'} in a {engine} collective that "
                f"{ranks_named(finished, job.unit)} will never enter: "
                f"{'they' if len(finished) > 1 else 'it'} finished the job's code ({at}); the "
                f"job was stopped. {UNEVEN_FIX}")


def _uneven_steps(job: JobState, finished: list[int],
                  stuck: dict[int, tuple[str, int | None]], at: str) -> str:
    """The verdict on DDP ranks left in a training step's gradient allreduce by peers that
    finished: who waits for whom, and the steps each took."""
    def took(rank: int) -> str:
        steps = job.ranks[rank].ddp_steps
        return f"{rank_named(rank, job.unit)} after {steps} steps" if steps else \
            rank_named(rank, job.unit)

    waiting = sorted(stuck)
    doing = ", ".join(f"{rank_named(rank, job.unit)} is in its step {stuck[rank][1]}"
                      for rank in waiting if stuck[rank][1])
    plural = len(waiting) > 1
    return (f"{ranks_named(waiting, job.unit)} {'wait' if plural else 'waits'} in "
            f"{DDP_ALLREDUCE} (inside backward()) for {ranks_named(finished, job.unit)}, which "
            f"finished the job's code ({', '.join(took(rank) for rank in finished)})"
            f"{'; ' + doing if doing else ''}. {'They' if plural else 'It'} would wait for "
            f"ever: the job was stopped ({at}). {UNEVEN_DDP_FIX}")


class Mismatch:
    """Every rank stalled (silent for the stall time) in a collective of another name than a
    peer's (``all_reduce`` against ``broadcast``), found twice :data:`LEFT_BEHIND_S` apart."""

    def __init__(self) -> None:
        self.asked = 0.0
        self.found: str | None = None

    while_failing = False  # see Monitor

    def check(self, turn: Turn) -> HorovodJobError | None:
        job, now = turn.job, turn.now
        running = job.running_ranks()
        if len(running) < 2 or job.finished_ranks() or not all(
                job.ranks[r].stalled_for(now, job.stall_after) is not None for r in running):
            self.found = None
            return None
        if now - self.asked < LEFT_BEHIND_S:
            return None
        self.asked = now
        mismatch = collect_stacks(job, turn.backend, turn.events).mismatch(job.unit)
        found, self.found = self.found, mismatch
        if not mismatch or mismatch != found:
            return None
        return HorovodJobError(f"{mismatch[0].upper()}{mismatch[1:]}; the job was stopped. "
                               f"{UNEVEN_FIX}", log_path=str(job.log_path))
