"""A sharded checkpoint's load refuses entries the state has no place for (issue 82, item 0):
an optimizer's ``state_dict()`` taken before its first step has an empty ``state``, and DCP read
nothing into it, so a job resumed with Adam's moments silently missing; a checkpoint of four
layers loaded into a model of three without a word. Real DCP, in one process (as Horovod's
ranks use it: no process group)."""
import pytest
import torch

from hvd_magics.errors import CheckpointMismatch
from hvd_magics.rank.api import torch_dcp


def _layers(count: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(count)))


def _trained(count: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _layers(count)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
    return model, optimizer


def test_plain_state_dicts_with_an_unstepped_optimizer_are_refused_naming_the_fix(tmp_path):
    model, optimizer = _trained()
    torch_dcp.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, tmp_path)
    fresh = _layers(2, seed=1)
    into = {"model": fresh.state_dict(),
            "opt": torch.optim.Adam(fresh.parameters(), lr=0.01).state_dict()}
    assert into["opt"]["state"] == {}  # what the user gives: nothing for the moments to go to
    with pytest.raises(CheckpointMismatch) as raised:
        torch_dcp.load(into, tmp_path)
    said = str(raised.value)
    assert "opt.state.0.exp_avg" in said and "state['opt'] is an optimizer's state_dict() " \
        "taken before its first step" in said, said
    assert "Fix: give the optimizer itself, with its model, on every rank: checkpoint.latest(" \
        "{'model': model, 'opt': optimizer})" in said, said


def test_the_optimizer_itself_before_its_first_step_gets_every_moment(tmp_path):
    """The fix the error names works: the same checkpoint read into the optimizer itself."""
    model, optimizer = _trained()
    torch_dcp.save({"model": model, "opt": optimizer}, tmp_path)
    fresh = _layers(2, seed=1)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.01)
    torch_dcp.load({"model": fresh, "opt": fresh_optimizer}, tmp_path)
    for before, after in zip(optimizer.state.values(), fresh_optimizer.state.values()):
        assert torch.equal(before["exp_avg"], after["exp_avg"])
        assert torch.equal(before["exp_avg_sq"], after["exp_avg_sq"])
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_a_checkpoint_of_more_layers_than_the_model_is_refused(tmp_path):
    model, optimizer = _trained(count=4)
    torch_dcp.save({"model": model, "opt": optimizer, "step": 7}, tmp_path)
    smaller = _layers(3)
    with pytest.raises(CheckpointMismatch) as raised:
        torch_dcp.load({"model": smaller, "opt": torch.optim.Adam(smaller.parameters()),
                        "step": 0}, tmp_path)
    said = str(raised.value)
    assert "entries the state it is read into has no place for: model.3.bias, model.3.weight" \
        in said, said
    assert "checkpoint.latest(state, strict=False)" in said, said


def test_strict_false_reads_what_the_state_holds(tmp_path):
    model, optimizer = _trained(count=4)
    torch_dcp.save({"model": model.state_dict(), "opt": optimizer.state_dict(), "step": 7},
                   tmp_path)
    fresh = _layers(4, seed=1)
    into = {"model": fresh.state_dict(), "step": 0}
    torch_dcp.load(into, tmp_path, strict=False)
    assert into["step"] == 7
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 into["model"].values()))
