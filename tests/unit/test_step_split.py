"""The rank's step timing in one process, with real torch (no ranks): which hooks a module keeps
and what one step's row holds."""
import os

import torch

from hvd_magics.rank import step_split


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
        assert split.schedstat >= 0 and later[0] > ran and later[1] >= waited
    else:
        assert split.schedstat == -1 and later == (0.0, 0.0)
