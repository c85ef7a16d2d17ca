"""The rank's step timing in one process, with real torch (no ranks): which hooks a module keeps
and what one step's row holds."""
import os

import torch

from hvd_magics.rank.instruments import step_split


def test_the_gradient_hooks_narrow_to_the_parameter_whose_gradient_is_ready_last():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    hooks = step_split._GradHooks(model)
    assert len(hooks.handles) == 4
    lasts = []
    for _ in range(step_split.NARROW_AFTER):
        step_split._split.last_grad = None
        model(torch.randn(2, 4)).sum().backward()
        lasts.append(step_split._split.last_grad)
        hooks.after_backward(lasts[-1])
    # backward reaches the first layer last: one of its parameters, the same each time
    first = {id(p) for p in model[0].parameters()}
    assert len(set(lasts)) == 1 and lasts[0] in first
    assert list(hooks.handles) == [lasts[0]]
    step_split._split.last_grad, before = None, step_split._split.grad_ready
    model(torch.randn(2, 4)).sum().backward()
    assert step_split._split.last_grad == lasts[0] and step_split._split.grad_ready > before


def test_the_thread_s_cpu_time_and_wait_for_a_cpu_are_read_where_linux_says_them():
    split = step_split._Split()
    ran, waited = step_split._cpu_s(split)
    sum(range(2_000_000))
    later = step_split._cpu_s(split)
    if os.path.exists("/proc/thread-self/schedstat"):
        assert split.cpu.readable and later[0] > ran and later[1] >= waited
    else:
        assert not split.cpu.readable and later == (0.0, 0.0)


def test_the_cpu_s_pace_is_probed_between_steps_and_counted_in_neither(monkeypatch):
    """Issue 82, item 1: the same work on a CPU shared with other work is slower, and reads as
    more work in the rank's CPU time; a fixed probe after a step tells the two apart. The
    probe's time is no step's: the next step begins after it."""
    monkeypatch.setattr(step_split, "_split", step_split._Split())
    monkeypatch.setattr(step_split, "PACE_EVERY_S", 0.0)
    monkeypatch.setattr(step_split, "PACE_WORK", 200_000)  # long enough to see in a row
    for _ in range(3):
        step_split._before_optimizer_step()
        step_split._on_optimizer_step()
    split = step_split._split
    assert [step for step, _ in split.paces] == [1, 2]
    probe = min(seconds for _, seconds in split.paces)
    assert probe > 0.001, split.paces
    assert all(row[1] < probe / 2 for row in split.rows), (split.rows, split.paces)


def test_a_wait_for_a_cpu_inside_a_collective_is_left_out_of_the_step_s_own_work(monkeypatch):
    """A rank woken when its peers are done waits for a CPU inside the collective on a busy
    host; that wait holds nobody back, so a step's CPU figures are its own work's."""
    readings = iter([(0.0, 0.0),  # the first step's end: the next step begins
                     (0.010, 0.002),  # entering the collective
                     (0.011, 0.030),  # leaving it: 28 ms of waiting for a CPU inside
                     (0.015, 0.031)])  # the step's end
    monkeypatch.setattr(step_split, "_split", step_split._Split())
    monkeypatch.setattr(step_split, "_cpu_s", lambda split: next(readings))
    monkeypatch.setattr(step_split, "PACE_EVERY_S", float("inf"))  # no probe between steps
    collective = step_split._timed(step_split._COMM, lambda: None)
    step_split._before_optimizer_step()
    step_split._on_optimizer_step()
    collective()
    step_split._before_optimizer_step()
    step_split._on_optimizer_step()
    (row,) = step_split._split.rows
    cpu_wait_s, cpu_s = row[4], row[5]
    assert round(cpu_wait_s, 6) == 0.003 and round(cpu_s, 6) == 0.014


def test_a_wait_for_input_keeps_its_cpu_figures_apart_within_the_step_s_own_work(monkeypatch):
    """The driver reads a rank's wait for a CPU in its input apart from the rest of its own
    work (a loader that sleeps is not a rank starved of a CPU in compute)."""
    readings = iter([(0.0, 0.0),  # the first step's end: the next step begins
                     (0.001, 0.000),  # asking for a batch
                     (0.002, 0.004),  # it came: 1 ms on a CPU, 4 ms waiting for one
                     (0.020, 0.010),  # entering the collective
                     (0.021, 0.011),  # leaving it
                     (0.030, 0.012)])  # the step's end
    monkeypatch.setattr(step_split, "_split", step_split._Split())
    monkeypatch.setattr(step_split, "_cpu_s", lambda split: next(readings))
    monkeypatch.setattr(step_split, "PACE_EVERY_S", float("inf"))  # no probe between steps
    batch = step_split._timed(step_split._INPUT, lambda: None)
    collective = step_split._timed(step_split._COMM, lambda: None)
    step_split._before_optimizer_step()
    step_split._on_optimizer_step()
    batch()
    collective()
    step_split._before_optimizer_step()
    step_split._on_optimizer_step()
    (row,) = step_split._split.rows
    assert [round(v, 6) for v in row[4:]] == [0.011, 0.029, 0.004, 0.001]
    assert len(step_split._split.totals) == 8
