"""Every hook a rank installs before the job's code runs, in order, and what each keeps per job:
whole writes of checkpoints, the stacks served to the driver (and its preemption notice), the
libraries' integrations, the DDP step count, the step split, the engine and shard guards, the
torch process group's hold."""
from __future__ import annotations


def install_writes() -> None:
    """Writes of the job's files are whole or absent (first: before anything writes)."""
    from hvd_magics.rank import whole_writes

    whole_writes.install()


def serve_stacks() -> None:
    """Answer the driver's requests for the rank's stacks, and take its preemption notice."""
    from hvd_magics.rank.api import preemption
    from hvd_magics.rank.instruments import stack_report

    stack_report.serve(preemption.on_order)


def install() -> None:
    """The libraries' integrations, the instruments and the guards."""
    from hvd_magics.rank import integrations, torch_group_hold
    from hvd_magics.rank.guards import engine_guard, shard_guard
    from hvd_magics.rank.instruments import ddp_watch, step_split

    integrations.install()
    ddp_watch.install()
    step_split.install()
    engine_guard.install()
    shard_guard.install()
    torch_group_hold.install()


def new_job() -> None:
    """A job (a warm pool's cell) starts: what the hooks count is its own."""
    from hvd_magics.rank.api import preemption
    from hvd_magics.rank.instruments import ddp_watch, step_split

    ddp_watch.reset()
    step_split.reset()
    preemption.reset()


def job_ended() -> None:
    """The job's function ended: the inferred last epoch with it, the last step split sent."""
    from hvd_magics.rank.instruments import step_split
    from hvd_magics.rank.integrations import plain_loops

    plain_loops.reset()
    step_split.flush(final=True)


def ddp_steps() -> int | None:
    """The DDP training steps the job took (``None``: none, or unknown)."""
    from hvd_magics.rank.instruments import ddp_watch

    return ddp_watch.steps()
