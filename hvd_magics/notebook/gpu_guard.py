"""Does the driver (the kernel process) hold a GPU? Checked without importing or initialising
anything.

A notebook that opened a TensorFlow session or touched ``torch.cuda`` keeps a GPU (and its
memory) for as long as the kernel lives, so the ranks cannot use it. This module only looks at
frameworks that are already imported and at the process's open file descriptors.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

#: Device files through which a process holds an NVIDIA GPU.
GPU_DEVICE_PATTERN = re.compile(r"^/dev/nvidia(\d+)$")
#: Where this process's open file descriptors are listed.
FD_DIR = "/proc/self/fd"


@dataclass(frozen=True)
class GpuHolder:
    """One way the driver holds a GPU."""

    framework: str
    device: str

    def __str__(self) -> str:
        return f"{self.framework} holds {self.device}"


def _tensorflow() -> list[GpuHolder]:
    if "tensorflow" not in sys.modules:
        return []
    try:
        from tensorflow.python.eager import context
        ctx = context.context()
        if getattr(ctx, "_context_handle", None) is None:  # eager context not initialised
            return []
        return [GpuHolder("TensorFlow", d.name) for d in ctx.list_logical_devices("GPU")]
    except Exception:  # noqa: BLE001 - a TF internals change must not break the magic
        return []


def _torch() -> list[GpuHolder]:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return []
        return [GpuHolder("PyTorch", f"cuda:{i}") for i in range(cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def _device_files(fd_dir: str = FD_DIR) -> list[GpuHolder]:
    found: list[GpuHolder] = []
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if GPU_DEVICE_PATTERN.match(target) and all(h.device != target for h in found):
            found.append(GpuHolder("a CUDA context (open device file)", target))
    return found


def driver_gpu_holders() -> list[GpuHolder]:
    """Every way this process holds a GPU; empty when it holds none."""
    holders = _tensorflow() + _torch()
    if not holders:
        holders = _device_files()
    return holders


def driver_gpu_message(holders: list[GpuHolder]) -> str:
    """The refusal text: what holds which GPU, why it matters, and the two fixes."""
    what = "; ".join(map(str, holders))
    return (f"The notebook's own process holds a GPU ({what}), so the Horovod ranks cannot use "
            "it. Fix: restart the kernel and keep GPU code inside %%horovod cells, or add "
            "--allow-driver-gpu to run anyway.")
