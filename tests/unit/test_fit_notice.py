"""The HorovodEstimator's fit on a preemption notice (no ranks): rank 0 writes the fit's own
checkpoint of the notice's step, every rank ends the attempt, and at an epoch's last step the
epoch is recorded first."""
import json

import pytest

from hvd_magics.errors import Preempted
from hvd_magics.rank.api import preemption
from hvd_magics.common.checkpoints import Position, latest_checkpoint
from hvd_magics.rank.fits.fit_common import FitBook
from hvd_magics.common.fit_spec import FitSpec, OptimizerRecipe


def _book(tmp_path, rank):
    spec = FitSpec(model=None, optimizer=OptimizerRecipe("name", "sgd"), learning_rate=0.1,
                   scale_learning_rate=False, loss="mse", metrics=[], features=["x"],
                   input_names=None, label="y", batch_size=4, epochs=3, max_steps=None,
                   shuffle=False, seed=0, model_dir=str(tmp_path), checkpoint_secs=None,
                   keep_checkpoints=3, classifier=None)
    state = {"position": {"epoch": 0, "step": 0, "global_step": 0}, "history": []}
    return FitBook(spec, rank, state, None,
                   lambda path, at, history: path.write_text(json.dumps(history)), "json")


@pytest.fixture
def notice(monkeypatch):
    """A notice every rank turns to at its 3rd call of checkpoint.preempting()."""
    monkeypatch.setattr(preemption, "_state", preemption._Notice())
    preemption.on_order(json.dumps({"at": 3, "notice": "executor 1 is being decommissioned"}))


def test_rank_0_saves_the_notice_s_step_and_every_rank_ends_the_attempt(tmp_path, notice,
                                                                         monkeypatch):
    book = _book(tmp_path, rank=0)
    book.after_step(1, 1, 10, 11)
    book.after_step(1, 2, 10, 12)
    assert latest_checkpoint(tmp_path) is None  # no notice yet, no timed checkpoint
    with pytest.raises(Preempted, match="the checkpoint of step 13 was saved on a preemption"):
        book.after_step(1, 3, 10, 13)
    assert latest_checkpoint(tmp_path)[0] == Position(1, 3, 13)  # resumes at step 4 of 10
    monkeypatch.setenv("HVD_MAGICS_RANK", "1")
    monkeypatch.setattr(preemption, "_state", preemption._Notice())
    preemption.on_order(json.dumps({"at": 1, "notice": "n"}))
    with pytest.raises(Preempted, match="rank 0 writes it"):
        _book(tmp_path / "r1", rank=1).after_step(1, 3, 10, 13)
    assert not (tmp_path / "r1").exists() or latest_checkpoint(tmp_path / "r1") is None


def test_a_notice_at_an_epoch_s_last_step_records_the_epoch_before_the_attempt_ends(tmp_path,
                                                                                    notice):
    """A checkpoint at (epoch, last step) resumed into an empty plan: the epochs after it were
    never run."""
    book = _book(tmp_path, rank=0)
    for done in (8, 9):
        book.after_step(0, done, 10, done)
    book.after_step(0, 10, 10, 10)  # the notice's step is the epoch's last: nothing ends yet
    with pytest.raises(Preempted, match="step 10 was saved"):
        book.end_epoch(0, 0, 10, 10, 10, {"loss": 1.0})
    assert latest_checkpoint(tmp_path)[0] == Position(1, 0, 10)
    assert book.history == [{"epoch": 1, "global_step": 10, "loss": 1.0}]
