"""A DataFrame's shard given to a library that deals its data out over the ranks again fails at
once, with the fix (not a job that trains on half of each shard and says it succeeded).

A rank's shard already holds only its rows. Hugging Face's ``Trainer`` and Lightning's
``Trainer`` (``use_distributed_sampler=True``, its default) each give every rank a part of the
dataset they are handed: given a shard, each rank would train on ``1/size`` of its shard, the
job on ``1/size`` of the DataFrame. :func:`install` checks, on the torch engine:

- Hugging Face's ``Trainer``, when made: a ``train_dataset`` as long as one of this rank's shards
  (the rows it was built from) in a world of several ranks;
- Lightning's ``Trainer.fit``: a ``DataLoader`` made by ``Shard.to_torch`` (or of a dataset as
  long as a shard) while Lightning would put its own ``DistributedSampler`` in.
"""
from __future__ import annotations

from typing import Any

from hvd_magics.rank.guards.import_hooks import after_call, after_import, before_call, refusing

_HF_TRAINER = "transformers.trainer"
_LIGHTNING_TRAINERS = ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer")
_GUARDED = "_hvd_magics_shard_guard"


class ShardDealtAgainError(ValueError):
    """A library would deal a rank's shard out over the ranks again."""


def shard_of(dataset: Any) -> Any:
    """The shard of this rank that ``dataset`` holds the rows of (``None`` if none): its rows
    are the shard's (``Shard.to_torch``), or it is as long as a shard of a job of several
    ranks."""
    from hvd_magics.rank.api import shard as shards  # numpy: only once a Trainer is made

    rows = getattr(dataset, "shard", None)
    if isinstance(rows, shards.Shard):
        return rows
    try:
        length = len(dataset)
    except TypeError:
        return None
    return next((s for s in shards.opened() if s.size > 1 and len(s) == length), None)


def hf_message(trainer: Any) -> str | None:
    """Why Hugging Face's ``trainer`` would train on part of its shard (``None``: it would not)."""
    if getattr(trainer.args, "world_size", 1) <= 1 or trainer.train_dataset is None:
        return None
    found = shard_of(trainer.train_dataset)
    if found is None:
        return None
    return (f"the Trainer's train_dataset holds this rank's shard of {found.name} "
            f"({len(found):,} of its {sum(found.rows_per_rank):,} rows), and the Trainer deals "
            f"its dataset out over the {trainer.args.world_size} ranks again: each rank would "
            f"train on 1/{trainer.args.world_size} of its shard. Fix: give every rank all the "
            f"rows (in the notebook, rows = {found.name}.toPandas(), and build the dataset from "
            f"rows in the cell: the Trainer deals them out), or train the shard in a loop of "
            f"your own ({found.name}.to_torch(...) under DistributedDataParallel).")


def lightning_message(trainer: Any, loaders: Any) -> str | None:
    """Why Lightning's ``trainer.fit`` would train on part of the shards ``loaders`` hold."""
    connector = getattr(trainer, "_accelerator_connector", None)
    if not getattr(connector, "use_distributed_sampler", False) or \
            getattr(trainer, "world_size", 1) <= 1:
        return None
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    for loader in loaders if isinstance(loaders, (list, tuple)) else [loaders]:
        found = shard_of(getattr(loader, "dataset", None)) if loader is not None else None
        if found is not None:
            return (f"the DataLoader given to Trainer.fit holds this rank's shard of "
                    f"{found.name} ({len(found):,} of its {sum(found.rows_per_rank):,} rows), "
                    f"and Lightning puts a DistributedSampler in it, which deals it out over the "
                    f"{trainer.world_size} ranks again. Fix: Trainer(use_distributed_sampler="
                    f"False, ...): the shard is this rank's already, and {found.name}.to_torch "
                    f"gives every rank the same number of batches.")
    return None


def _guard_hf(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        after_call(trainer, "__init__", refusing(hf_message, ShardDealtAgainError), _GUARDED)


def _fit_message(trainer: Any, _model: Any = None, train_dataloaders: Any = None, *_args: Any,
                 **kwargs: Any) -> str | None:
    return lightning_message(trainer, kwargs.get("train_dataloaders", train_dataloaders))


def _guard_lightning(module: Any) -> None:
    trainer = getattr(module, "Trainer", None)
    if trainer is not None:
        before_call(trainer, "fit", refusing(_fit_message, ShardDealtAgainError), _GUARDED)


def install() -> None:
    """Check the Trainers of Hugging Face and Lightning whenever they are imported."""
    after_import((_HF_TRAINER,), _guard_hf)
    after_import(_LIGHTNING_TRAINERS, _guard_lightning)
