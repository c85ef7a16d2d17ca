"""Sizes in bytes as people read them."""
from __future__ import annotations


def byte_size(count: float, binary: bool = False) -> str:
    """``"512 B"``, ``"12.3 MB"``, ``"1.2 GB"``: decimal units, as disks and downloads say, or
    with ``binary`` units of 1,024, as memory is counted (and tools such as ``nvidia-smi`` say
    it, still writing MB and GB)."""
    base = 1024 if binary else 1000
    for unit in ("B", "KB", "MB", "GB"):
        if count < base or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= base
    return f"{count:.1f} GB"
