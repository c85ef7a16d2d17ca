"""A small disk of its own for a test: a tmpfs of a given size mounted on a folder (root, as CI
and these machines have), so that a write really finds the disk full (``ENOSPC``)."""
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """``where`` (made) as a disk of ``size`` (``"512k"``, ``"2m"``) for the ``with``'s while."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to its last byte with one file; that file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (2 ** 16, 2 ** 10, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler
