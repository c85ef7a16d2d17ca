"""Steps kept in a host's memory (``checkpoint.keep``): where they live and how a part is written
and read whole.

A host's kept steps are files in its shared memory (``/dev/shm``, a ``tmpfs``: pages of the
host's memory that outlive the process that wrote them, its Spark task and its Python workers),
in a folder of the user's own (``HVD_MAGICS_KEEP_DIR`` overrides it)::

    <root>/<host>/<job>/step-<step>.part-<part>-of-<parts>

``<host>`` is the rank's host as its task named it (namespace hosts share one ``/dev/shm`` and
keep apart), ``<job>`` the job's key. A part is the whole replicated state (``-of-1``, written
once per host by its first rank) or one rank's part of a sharded state. It is written under a
temporary name (``.step-...tmp-<pid>``) and renamed into place once its last byte is copied: a
part in place is whole, and a process killed mid-copy leaves the step before it whole. A part
keeps two steps, the newest and the one before (double-buffered): the third step's copy reuses
the oldest one's pages.

A part is ``MAGIC``, the header's length, the header (a pickle: the state's tree with each
tensor and array replaced by a :class:`Slot` into the bytes), padding to 64 bytes, then every
tensor's and array's bytes.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import socket
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvd_magics.protocol import ENV_KEEP_DIR

MAGIC = b"HVDKEEP1"
_LENGTH = struct.Struct("<Q")
ALIGN = 64
#: Steps a part keeps: the newest and the one before it.
STEPS_KEPT = 2
_PART = re.compile(r"^step-(?P<step>\d+)\.part-(?P<part>\d+)-of-(?P<parts>\d+)$")


@dataclass(frozen=True)
class Slot:
    """Where one tensor's or array's bytes are in a part: ``kind`` ``"torch"`` or ``"numpy"``,
    its dtype's name, shape, and offset from the start of the bytes; ``sharded``: the rank's own
    part of a sharded tensor (a ``DTensor``'s local tensor)."""

    kind: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sharded: bool = False


@dataclass(frozen=True)
class ModuleState:
    """A module's state dict, loaded back with ``load_state_dict``."""

    tree: Any


@dataclass(frozen=True)
class OptimizerState:
    """An optimizer's state dict, loaded back with ``load_state_dict``."""

    tree: Any


@dataclass(frozen=True)
class PartName:
    """One part of one step."""

    step: int
    part: int = 0
    parts: int = 1

    @property
    def file(self) -> str:
        return f"step-{self.step}.part-{self.part}-of-{self.parts}"

    @classmethod
    def parse(cls, name: str) -> PartName | None:
        found = _PART.match(name)
        return cls(int(found["step"]), int(found["part"]), int(found["parts"])) if found \
            else None


def keep_root(env: dict[str, str] | None = None) -> Path:
    """The user's folder of kept steps on this host (``HVD_MAGICS_KEEP_DIR``, by default in
    ``/dev/shm``, or the temporary folder where there is none)."""
    given = (env or os.environ).get(ENV_KEEP_DIR)
    if given:
        return Path(given)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"hvd-magics-keep-{os.getuid()}"


def host_folder(root: Path, host: str | None) -> Path:
    """The folder of ``host``'s kept steps (``host`` as a file name)."""
    name = re.sub(r"[^\w.:-]", "_", host or socket.gethostname()) or "host"
    return root / name


def job_folder(root: Path, host: str | None, job: str) -> Path:
    return host_folder(root, host) / job


def parts_in(folder: Path) -> list[PartName]:
    """The parts in place in ``folder`` (whole), any order."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [part for part in map(PartName.parse, names) if part is not None]


def whole_steps(folder: Path) -> list[int]:
    """The steps of which every part is in ``folder``, newest first."""
    by_step: dict[tuple[int, int], set[int]] = {}
    for part in parts_in(folder):
        by_step.setdefault((part.step, part.parts), set()).add(part.part)
    return sorted({step for (step, parts), have in by_step.items() if len(have) == parts},
                  reverse=True)


def older_parts(folder: Path, part: int, parts: int, newest: int,
                kept: int = STEPS_KEPT) -> list[Path]:
    """This part's files but the ``kept`` newest up to step ``newest`` (oldest first): the
    buffers the copy of a new step may reuse (``kept`` one less), or what goes once it is in
    place."""
    mine = sorted(p.step for p in parts_in(folder)
                  if p.part == part and p.parts == parts and p.step <= newest)
    return [folder / PartName(step, part, parts).file for step in mine[:len(mine) - kept]]


def layout(tree: Any, slots: list[Slot]) -> tuple[bytes, int]:
    """The header of a part holding ``tree`` and the offset its bytes start at."""
    header = pickle.dumps({"tree": tree, "nbytes": sum(s.nbytes for s in slots)}, protocol=5)
    start = len(MAGIC) + _LENGTH.size + len(header)
    return header, -(-start // ALIGN) * ALIGN


def write_header(buffer: memoryview, header: bytes) -> None:
    """``MAGIC``, the header's length and the header, at the start of ``buffer``."""
    end = len(MAGIC) + _LENGTH.size
    buffer[:len(MAGIC)] = MAGIC
    buffer[len(MAGIC):end] = _LENGTH.pack(len(header))
    buffer[end:end + len(header)] = header


def read_header(data: memoryview) -> tuple[Any, int]:
    """A part's tree and the offset its bytes start at.

    Raises
    ------
    ValueError
        ``data`` is not a part.
    """
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise ValueError("not a kept step's part")
    end = len(MAGIC) + _LENGTH.size
    (length,) = _LENGTH.unpack(data[len(MAGIC):end])
    header = pickle.loads(data[end:end + length])
    start = -(-(end + length) // ALIGN) * ALIGN
    if len(data) < start + header["nbytes"]:
        raise ValueError("a kept step's part is shorter than its header says")
    return header["tree"], start


def remove_job(root: Path, job: str) -> None:
    """Remove ``job``'s kept steps from every host folder under ``root``."""
    for folder in root.glob(f"*/{job}") if root.is_dir() else ():
        shutil.rmtree(folder, ignore_errors=True)


def secret_matches(folder: Path, secret_digest: str) -> bool:
    """Whether ``secret_digest`` is the one the job's folder was made with."""
    with contextlib.suppress(OSError):
        return (folder / ".secret").read_text().strip() == secret_digest
    return False
