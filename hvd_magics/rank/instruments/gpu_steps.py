"""A DDP step's time on its GPU, from CUDA events read once the GPU has passed them.

On a GPU the host thread runs ahead of the kernels, and NCCL's waits do not block it: the host's
clock cannot say how long a rank's GPU computed, or waited for the other ranks' gradients. So on
a rank whose DDP module is on a CUDA device, three events are recorded on the current stream each
step, besides the previous step's end (its start): when its last gradient is ready, at the end of
``backward()`` (whose end DDP makes wait for the allreduce) and at the end of the optimizer
step. Nothing waits for them: a step's row is made once its last event has completed
(``query()``), a few steps late, and at the job's end. comm is the time from the last gradient
to the end of ``backward()``; the rest of the step is compute (and input, as the host waited
for it).

The last gradient: each parameter's gradient hook counts its calls, and the call whose number is
the previous backward's count records the event (one event a step, not one per parameter). A
step whose backward counted otherwise (the graph changed) has no row.
"""
from __future__ import annotations

import collections
from typing import Any

#: Index of each event in a pending step.
_START, _GRAD, _BACKWARD_END, _END = range(4)


#: Events whose steps were read, to record again (making one costs more than recording it).
_free: list[Any] = []


def _event() -> Any:
    if _free:
        event = _free.pop()
    else:
        import torch

        event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class GpuSteps:
    """The CUDA events of one rank's DDP steps, and the rows made of those the GPU passed."""

    def __init__(self) -> None:
        #: ``(step, input_s, [start, grad, backward_end, end])`` of steps not read yet.
        self.pending: collections.deque = collections.deque()
        self._marks: list[Any] = [None, None, None, None]
        self._calls = 0
        self._expected = 0

    def on_grad(self) -> None:
        """A parameter's gradient is ready (autograd's thread)."""
        self._calls += 1
        if self._calls == self._expected:
            self._marks[_GRAD] = _event()

    def on_backward_end(self) -> None:
        """A DDP step's ``backward()`` returned."""
        if self._calls != self._expected:
            self._marks[_GRAD] = None  # the graph changed: no last-gradient mark this step
        self._expected, self._calls = self._calls, 0
        self._marks[_BACKWARD_END] = _event()

    def on_step_end(self, step: int, input_s: float, host: list[float]) -> list[list[float]]:
        """The optimizer stepped: keep this step's events (and its host thread's ``[cpu_wait_s,
        cpu_s, input_cpu_wait_s, input_cpu_s]``); the rows of steps now passed."""
        end = _event()
        marks, self._marks = self._marks, [end, None, None, None]
        marks[_END] = end
        if all(mark is not None for mark in marks):
            self.pending.append((step, input_s, host, marks))
        return self.ready()

    def ready(self, wait: bool = False) -> list[list[float]]:
        """``[step, step_s, input_s, comm_s, cpu_wait_s, cpu_s, input_cpu_wait_s, input_cpu_s]``
        of each kept step whose events the GPU has passed (all of them with ``wait``, which
        synchronises once: at the job's end; the last four are the host thread's)."""
        if wait and self.pending:
            self.pending[-1][3][_END].synchronize()
        rows = []
        while self.pending and self.pending[0][3][_END].query():
            step, input_s, host, marks = self.pending.popleft()
            step_s = marks[_START].elapsed_time(marks[_END]) / 1000
            comm_s = max(0.0, marks[_GRAD].elapsed_time(marks[_BACKWARD_END]) / 1000)
            rows.append([step, step_s, min(input_s, max(0.0, step_s - comm_s)), comm_s, *host])
            # its end is the next step's start, still pending; the rest is free again
            _free.extend(marks[i] for i in (_START, _GRAD, _BACKWARD_END)
                         if len(_free) < 64 and marks[i] is not marks[_END])
        return rows
