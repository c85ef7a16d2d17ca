"""A rank's GPU memory and utilisation, when it uses a CUDA device through PyTorch.

Read only where a CUDA context already exists (``torch.cuda.is_initialized()``): a CPU rank, or a
rank that has not touched its GPU, reads nothing and creates nothing. Memory is PyTorch's own
account of the rank's device (allocated now, and the peak since the job began); utilisation is
NVML's (``torch.cuda.utilization``, which needs ``pynvml``), left out where NVML is missing.
"""
from __future__ import annotations

import sys

from hvd_magics.events import GpuReading


def reading() -> GpuReading | None:
    """``{"device", "used", "peak", "total", "util"}`` (bytes; util in percent or ``None``), or
    ``None`` on a rank without a CUDA context."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return None
    device = cuda.current_device()
    try:
        util = cuda.utilization(device)
    except Exception:  # noqa: BLE001 - NVML missing or unsupported: memory only
        util = None
    return GpuReading(device=device, used=cuda.memory_allocated(device),
                      peak=cuda.max_memory_allocated(device),
                      total=cuda.get_device_properties(device).total_memory, util=util)
