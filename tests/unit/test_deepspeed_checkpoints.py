"""A DeepSpeed engine's checkpoint read on another number of ranks than wrote it (issue 82, item
7): every rank refuses it alike, before DeepSpeed reads a file; DeepSpeed itself said it on rank
0 only (``... is not currently supported..``) and a bare ``AssertionError`` on a rank with no
partition to read, which the job's error could name first. No DeepSpeed here: an engine's
attributes, and the files its ``save_checkpoint`` writes."""
import sys
import types
from pathlib import Path

import pytest

from hvd_magics.errors import CheckpointMismatch
from hvd_magics.rank.api.deepspeed_checkpoint import TAG, load_engine


class Engine:
    """What ``load_engine`` asks of a DeepSpeed engine; reading fails as DeepSpeed's did."""

    def __init__(self, ranks: int, universal: bool = False) -> None:
        self.world_size = self.seq_dp_world_size = ranks
        self.universal = universal
        self.read = False
        #: What DeepSpeed's reading raises.
        self.said = ""

    def load_universal_checkpoint(self) -> bool:
        return self.universal

    def load_checkpoint(self, folder: str, tag: str) -> tuple:
        self.read = True
        raise AssertionError(self.said)


def _saved(folder: Path, ranks: int, prefix: str = "", stage: int = 2) -> Path:
    (folder / TAG).mkdir(parents=True)
    names = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ranks)]
    names += ([f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ranks)]
              if stage == 3 else ["mp_rank_00_model_states.pt"])
    for name in names:
        (folder / TAG / name).write_bytes(b"")
    return folder


@pytest.mark.parametrize("prefix, stage", [("", 2), ("bf16_", 2), ("", 3)])
def test_a_zero_checkpoint_of_two_ranks_read_by_four_is_refused_alike_before_deepspeed_reads(
        tmp_path, prefix, stage):
    folder = _saved(tmp_path / "ckpt-9-e0-s0.dcp", 2, prefix, stage)
    said = set()
    for rank in range(4):  # each rank's engine: the same words, whatever its rank
        engine = Engine(4)
        with pytest.raises(CheckpointMismatch) as refused:
            load_engine(engine, folder)
        assert not engine.read
        said.add(str(refused.value))
    assert len(said) == 1
    text = said.pop()
    assert f"{folder} was saved by 2 ranks, and this job has 4" in text, text
    assert "Fix: run on 2 ranks, or convert it with DeepSpeed's ds_to_universal.py" in text
    assert ".." not in text.replace("(...", "")


def test_on_as_many_ranks_or_read_as_universal_deepspeed_reads_it_and_its_words_end_once(
        tmp_path, monkeypatch):
    # DeepSpeed's exception class, without importing DeepSpeed (9 s)
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero.utils", types.SimpleNamespace(
        ZeRORuntimeException=type("ZeRORuntimeException", (Exception,), {})))
    folder = _saved(tmp_path / "ckpt-9-e0-s0.dcp", 2)
    for engine, said, ends in ((Engine(2), "", "AssertionError."),
                               (Engine(4, universal=True), "not currently supported.",
                                "not currently supported."),
                               (Engine(2), "shapes differ", "shapes differ.")):
        engine.said = said
        with pytest.raises(CheckpointMismatch) as refused:
            load_engine(engine, folder)
        assert engine.read
        assert f"does not fit this engine: {ends} Fix: the model and ZeRO stage" in \
            str(refused.value), refused.value
