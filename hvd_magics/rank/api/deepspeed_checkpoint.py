"""A DeepSpeed engine's checkpoints through ours (``checkpoint.save(engine, step)``,
``checkpoint.latest(engine)``): DeepSpeed's own ``save_checkpoint`` files, every rank its ZeRO
partition, put in place whole by :mod:`hvd_magics.rank.api.checkpoint`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hvd_magics.errors import CheckpointMismatch, ShardedStateRefused, sentence

#: The tag (sub-folder) of a DeepSpeed engine's checkpoint inside ours
#: (``ckpt-<step>-e0-s0.dcp/deepspeed/``): DeepSpeed's own files, as ``save_checkpoint`` writes
#: them (``mp_rank_00_model_states.pt``, ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``).
TAG = "deepspeed"


def is_engine(value: Any) -> bool:
    """Whether ``value`` is a DeepSpeed engine (what ``deepspeed.initialize`` returns first)."""
    return any(c.__name__ == "DeepSpeedEngine" and c.__module__.startswith("deepspeed")
               for c in type(value).__mro__)


def _module_or_optimizer(value: Any) -> bool:
    return any(c.__module__.split(".")[0] == "deepspeed" or
               (c.__module__.startswith(("torch.nn", "torch.optim"))
                and c.__name__ in ("Module", "Optimizer"))
               for c in type(value).__mro__)


def engine_in(state: Any) -> tuple[Any, dict[str, Any], str | None] | None:
    """``(engine, the other values, the engine's key)`` when ``state`` is a DeepSpeed engine
    or a dict holding one (its other values are saved beside it, as DeepSpeed's
    ``client_state``); ``None`` otherwise.

    Raises
    ------
    ShardedStateRefused
        The dict holds two engines, or a model or optimizer beside its engine (which saves its
        own).
    """
    if is_engine(state):
        return state, {}, None
    if not isinstance(state, dict):
        return None
    engines = [key for key, value in state.items() if is_engine(value)]
    if not engines:
        return None
    others = {key: value for key, value in state.items() if key != engines[0]}
    beside = [key for key, value in others.items() if _module_or_optimizer(value)]
    if len(engines) > 1 or beside:
        extra = engines[1:] + beside
        raise ShardedStateRefused(
            f"checkpoint.save got the DeepSpeed engine state[{engines[0]!r}] and, beside it, "
            f"{', '.join(f'state[{k!r}]' for k in extra)}: the engine saves its model and its "
            f"optimizer itself (each rank its ZeRO partition), and a state holds one engine. "
            f"Fix: checkpoint.save({{{engines[0]!r}: engine, 'step': step}}, step), other "
            f"values beside it plain (numbers, strings, tensors)")
    return state[engines[0]], others, engines[0]


def save_engine(engine: Any, others: dict[str, Any], folder: Path) -> None:
    """Every rank writes its part of ``engine`` (its ZeRO partition of the optimizer, and of
    the parameters under stage 3) into ``folder``, with ``others`` as DeepSpeed's
    ``client_state``; returns once every rank's part is written (a collective)."""
    import torch.distributed as dist

    engine.save_checkpoint(str(folder), tag=TAG, client_state=dict(others), save_latest=False)
    if dist.is_initialized():
        dist.barrier()  # rank 0 puts the folder in place once every part is in it


def load_engine(engine: Any, folder: Path) -> dict[str, Any]:
    """Read the checkpoint in ``folder`` into ``engine`` (its module, optimizer, scheduler);
    the values saved beside it.

    Raises
    ------
    CheckpointMismatch
        The checkpoint is not a DeepSpeed engine's, or does not fit this engine (another
        model, another number of ranks under ZeRO).
    """
    if not (folder / TAG).is_dir():
        raise CheckpointMismatch(
            f"the checkpoint {folder} was not written from a DeepSpeed engine (it holds PyTorch's "
            f"distributed checkpoint of modules and optimizers), and latest() was given one. "
            f"Fix: give latest() the state as the job saved it, or start over without it: "
            f"--fresh (HorovodRunner(..., fresh=True))")
    saved_ranks = _saved_ranks(folder / TAG)
    ranks = _ranks_of(engine)
    if saved_ranks and saved_ranks != ranks and not _reads_universal(engine):
        # said by every rank alike, before DeepSpeed reads anything (which said it on one rank
        # and a bare AssertionError on a rank that has no partition to read)
        raise CheckpointMismatch(
            f"the DeepSpeed checkpoint {folder} was saved by {saved_ranks} ranks, and this job "
            f"has {ranks}: DeepSpeed reads a ZeRO checkpoint on the number of ranks that wrote "
            f"it (each rank its partition of the optimizer's state). Fix: run on {saved_ranks} "
            f"ranks, or convert it with DeepSpeed's ds_to_universal.py and set 'checkpoint': "
            f"{{'load_universal': true}} in the config, or start over without it: --fresh "
            f"(HorovodRunner(..., fresh=True))")
    from deepspeed.runtime.zero.utils import ZeRORuntimeException

    try:
        path, client = engine.load_checkpoint(str(folder), tag=TAG)
    except (ZeRORuntimeException, RuntimeError, ValueError, KeyError, AssertionError,
            IndexError) as exc:
        said = " ".join(str(exc).split()) or type(exc).__name__
        raise CheckpointMismatch(
            f"the DeepSpeed checkpoint {folder} does not fit this engine: "
            f"{sentence(said[:300])} Fix: the model and ZeRO stage it was saved from, on "
            f"{saved_ranks or 'as many'} ranks, or start over without it: --fresh "
            f"(HorovodRunner(..., fresh=True))") from None
    if path is None:
        raise CheckpointMismatch(
            f"DeepSpeed found no checkpoint in {folder / TAG}. Fix: start over without it: "
            f"--fresh (HorovodRunner(..., fresh=True))")
    return dict(client or {})


def _saved_ranks(folder: Path) -> int:
    """How many ranks wrote the ZeRO checkpoint in ``folder``: its partitions' files
    (``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``, ``bf16_`` before it in bf16 training;
    under stage 3 the parameters' too), ``0`` without any (no ZeRO: any number of ranks reads
    it)."""
    return max(len(list(folder.glob(f"*zero_pp_rank_*_mp_rank_00_{kind}_states.pt")))
               for kind in ("optim", "model"))


def _ranks_of(engine: Any) -> int:
    """The ranks among which ``engine`` partitions its state (its data-parallel world)."""
    return int(getattr(engine, "seq_dp_world_size", None) or engine.world_size)


def _reads_universal(engine: Any) -> bool:
    """Whether ``engine`` reads DeepSpeed's universal checkpoints (any number of ranks)."""
    reads = getattr(engine, "load_universal_checkpoint", None)
    return bool(reads()) if callable(reads) else False
