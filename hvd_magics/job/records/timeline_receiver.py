"""Rank 0's Horovod Timeline as it reaches the driver: sent in chunks when rank 0 runs elsewhere,
copied from where rank 0 wrote it when it runs on this host; made valid JSON at the end, or so
far while the job runs."""
from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import IO

from hvd_magics.job.records.timeline import repair


class TimelineReceiver:
    """Puts rank 0's trace at ``dest`` (``None``: the job records none)."""

    def __init__(self, dest: Path | None) -> None:
        self.dest = dest
        self._file: IO[bytes] | None = None
        self._local: str | None = None

    def written_at(self, path: str | None) -> None:
        """Rank 0 writes its trace at ``path`` (on its host)."""
        self._local = path

    def chunk(self, data: str) -> None:
        """A part of the trace rank 0 sent (base64)."""
        if self.dest is None:
            return
        if self._file is None:
            self.dest.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.dest, "wb")  # noqa: SIM115
        self._file.write(base64.b64decode(data))

    def so_far(self) -> Path | None:
        """A running job's trace as rank 0 has written it so far, copied beside its destination
        and made valid; ``None`` when rank 0 writes it on another host (it comes at the end)."""
        if self.dest is None or not self._local:
            return None
        source = Path(self._local)
        if not source.exists():
            return None
        copy = self.dest.with_name(self.dest.stem + ".so-far.json")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)
        repair(copy)
        return copy

    def finish(self) -> Path | None:
        """Close the trace sent by rank 0; if none came (the job was stopped) but rank 0 wrote it
        on this host, copy it. Then make it valid JSON. Return its path, or ``None``."""
        if self.dest is None:
            return None
        if self._file is not None:
            self._file.close()
        elif self._local and Path(self._local).exists():
            self.dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self._local, self.dest)
            Path(self._local).unlink()
        else:
            return None
        repair(self.dest)
        return self.dest
