"""A rank's mean step, split into its parts: input, compute and communication, with its training
thread's wait for a CPU and time on one (:mod:`hvd_magics.rank.instruments.step_split` sends each
step's row), the clock that timed it, and a window's mean that leaves a one-off long step out."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from hvd_magics.job.readings.wait_accounting import Row
from hvd_magics.protocol import STEP_COLUMNS

#: What a GPU rank's split is prefixed with: its clock is the host thread's (the GPU's kernels
#: run asynchronously; where the thread waits for them is where their time shows).
HOST_TIME = "host time: "
#: ...and a DDP rank's on a CUDA device, timed by the GPU's own events
#: (rank/instruments/gpu_steps.py).
GPU_TIME = "GPU time: "
#: A step longer than this many times the window's median is left out of a look.
OUTLIER = 3.0


@dataclass(frozen=True)
class StepParts:
    """Mean seconds per step of one rank: the whole step and its parts (``cpu_wait_s`` and
    ``cpu_s``: how long its training thread was ready to run but waited for a CPU, and ran on
    one, in its own work; ``input_cpu_wait_s`` and ``input_cpu_s``: of those, in its input)."""

    step_s: float
    input_s: float
    comm_s: float
    cpu_wait_s: float = 0.0
    cpu_s: float = 0.0
    input_cpu_wait_s: float = 0.0
    input_cpu_s: float = 0.0

    @property
    def compute_s(self) -> float:
        return max(0.0, self.step_s - self.input_s - self.comm_s)

    @property
    def compute_cpu_wait_s(self) -> float:
        return max(0.0, self.cpu_wait_s - self.input_cpu_wait_s)

    @property
    def compute_cpu_s(self) -> float:
        return max(0.0, self.cpu_s - self.input_cpu_s)

    @property
    def own_s(self) -> float:
        """Its own work: everything but the wait in collectives."""
        return self.input_s + self.compute_s

    def shares(self, clock: str = "") -> str:
        """``"input 4% · compute 61% · comm 35%"``, after ``clock`` (:data:`HOST_TIME` or
        :data:`GPU_TIME` on a GPU rank)."""
        if self.step_s <= 0:
            return ""
        return clock + " · ".join(f"{name} {100 * value / self.step_s:.0f}%" for name, value in (
            ("input", self.input_s), ("compute", self.compute_s), ("comm", self.comm_s)))


def clock_label(clock: str, on_gpu: bool) -> str:
    """:data:`GPU_TIME` for rows of the GPU's clock, :data:`HOST_TIME` for a GPU rank's host
    clock, else ``""``."""
    return GPU_TIME if clock == "gpu" else HOST_TIME if on_gpu else ""


def window_parts(rows: list[Row], rhythm: bool = False, keep_all: bool = False) -> StepParts:
    """The mean of a window's steps, steps longer than :data:`OUTLIER` times its median left
    out; with ``rhythm``, only when one step is (several are a rhythm of the job: a pipeline
    that makes every third batch late is not a one-off); with ``keep_all``, none."""
    limit = OUTLIER * statistics.median(row[0] for row in rows)
    kept = [row for row in rows if row[0] <= limit] or rows
    if keep_all or (rhythm and len(rows) - len(kept) > 1):
        kept = rows
    return StepParts(*(sum(row[i] for row in kept) / len(kept)
                       for i in range(len(STEP_COLUMNS))))


def step_columns(parts: StepParts) -> dict[str, float]:
    """A mean step's columns in the intervals and the rank rows."""
    return {"step_s": parts.step_s, "input_s": parts.input_s, "compute_s": parts.compute_s,
            "comm_s": parts.comm_s, "cpu_wait_s": parts.cpu_wait_s, "cpu_s": parts.cpu_s}
