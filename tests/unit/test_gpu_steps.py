"""A DDP step's GPU time from CUDA events (no GPU here: the events are stand-ins that carry the
time they stand for, the only mock; what is checked is which marks make which row)."""
from hvd_magics.rank.instruments import gpu_steps


class FakeEvent:
    now = 0.0  # ms on the "GPU"

    def __init__(self):
        self.at = FakeEvent.now
        self.done = True

    def query(self):
        return self.done

    def synchronize(self):
        self.done = True

    def elapsed_time(self, later):
        return later.at - self.at


def _step(gpu, step, grads=3, compute=20.0, comm=5.0, tail=2.0, input_s=0.001, cpu_wait=0.002):
    for _ in range(grads):
        FakeEvent.now += compute / grads
        gpu.on_grad()
    FakeEvent.now += comm
    gpu.on_backward_end()
    FakeEvent.now += tail
    return gpu.on_step_end(step, input_s, [cpu_wait, 0.003])


def test_rows_come_from_the_third_step_with_the_gpu_s_compute_and_comm(monkeypatch):
    monkeypatch.setattr(gpu_steps, "_event", FakeEvent)
    gpu = gpu_steps.GpuSteps()
    assert gpu.on_step_end(0, 0.0, [0.0, 0.0]) == []  # the first step's start
    assert _step(gpu, 1) == []  # its backward's count is not known before it: no row
    rows = _step(gpu, 2) + _step(gpu, 3, comm=9.0)
    assert [[round(v, 6) for v in row] for row in rows] == [[2, 0.027, 0.001, 0.005, 0.002, 0.003],
                                                             [3, 0.031, 0.001, 0.009, 0.002, 0.003]]
    assert _step(gpu, 4, grads=4) == []  # the graph changed: no mark for its last gradient
    assert len(_step(gpu, 5, grads=4)) == 1


def test_a_step_the_gpu_has_not_passed_waits_and_the_end_waits_for_all(monkeypatch):
    monkeypatch.setattr(gpu_steps, "_event", FakeEvent)
    gpu = gpu_steps.GpuSteps()
    gpu.on_step_end(0, 0.0, [0.0, 0.0])
    _step(gpu, 1)
    _step(gpu, 2)  # its row was made at once (its events had completed)
    original = FakeEvent.__init__

    def late(self):
        original(self)
        self.done = False  # the GPU is behind the host

    monkeypatch.setattr(FakeEvent, "__init__", late)
    assert _step(gpu, 3) == [] and len(gpu.pending) == 1
    assert [row[0] for row in gpu.ready(wait=True)] == [3] and not gpu.pending
