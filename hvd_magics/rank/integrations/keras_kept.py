"""Keras's ``fit`` keeps every step in the hosts' memory (``--keep-steps``, ``keep_steps=True``),
with no line added, in a Horovod job (:mod:`hvd_magics.rank.integrations.keras` calls it).

After each training batch, the first rank of each host keeps the model's variables, its
optimizer's (Adam's slots, the iteration count) and where the fit is (epoch, batch, global step)
(:mod:`hvd_magics.rank.api.keeping`). A later attempt's ``fit`` resumes from the step every host
holds when that is newer than a checkpoint saved on a preemption notice: the variables assigned,
and the fit started at the next batch with its input advanced past the batches done, as a fit
resumed from a notice is. Not under ``tf.distribute``: reading a variable synchronised on read
is a collective of every worker, which one worker keeping alone would wait in.
"""
from __future__ import annotations

from typing import Any

from hvd_magics.protocol import ENGINE_HOROVOD
from hvd_magics.rank.api.checkpoint import latest
from hvd_magics.rank.api.keeping import keep, writes_kept_steps
from hvd_magics.rank.api.kept_restore import memory_step_newer_than
from hvd_magics.rank.rank_job import rank_job


def keeps_steps() -> bool:
    """Whether a ``fit`` here keeps its steps: asked, in a Horovod job."""
    job = rank_job()
    return job.keep_steps and job.engine == ENGINE_HOROVOD


def _optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables (a property of Keras's optimizers, a method of the legacy
    ones)."""
    found = getattr(optimizer, "variables", None)
    return list(found() if callable(found) else found or [])


def keep_step(model: Any, epoch: int, batch: int, step: int) -> None:
    """Keep the variables and the position after global step ``step`` (the host's first
    rank)."""
    if writes_kept_steps():
        keep({"weights": [v.numpy() for v in model.weights],
              "optimizer": [v.numpy() for v in _optimizer_variables(model.optimizer)],
              "position": [epoch, batch, step]}, step)


def kept_step_to_resume(notice_step: int | None) -> int | None:
    """The global step kept in the hosts' memory this attempt resumes from, when it is newer
    than ``notice_step`` (a checkpoint saved on a notice); else ``None``."""
    return memory_step_newer_than(notice_step) if keeps_steps() else None


def restore_kept(model: Any) -> tuple[int, int, int]:
    """Assign the kept step's variables to ``model`` and its optimizer (built first, so that
    its slots exist); the ``(epoch, batch, global step)`` it was kept at."""
    state, _ = latest()  # type: ignore[misc]
    optimizer = model.optimizer
    if model.built and callable(getattr(optimizer, "build", None)) and \
            not getattr(optimizer, "_built", False):
        optimizer.build(model.trainable_variables)
    for variable, value in zip(model.weights, state["weights"]):
        variable.assign(value)
    for variable, value in zip(_optimizer_variables(optimizer), state["optimizer"]):
        variable.assign(value)
    epoch, batch, step = state["position"]
    return int(epoch), int(batch), int(step)
