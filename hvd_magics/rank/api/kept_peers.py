"""The ring of a sharded job's hosts (:mod:`hvd_magics.rank.api.keeping`): each rank's part of every
kept step also held by the next host's keeper, so that a lost host's parts are on its peer.

The peer is found once, at the first sharded step a rank keeps: every rank says its host and
its host's keeper (``all_gather_object``: every rank of a sharded job keeps each step), and a
host's peer is the next host in the ranks' order (the last host's, the first). A part is sent in
the background once in place here; when the link does not keep up (the step before is still on
its way), that step's peer copy is skipped, and the driver's record says how far the peers lag.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from hvd_magics.common.kept_steps import PartName
from hvd_magics.common.step_keeper_wire import put
from hvd_magics.events import KeptEvent
from hvd_magics.protocol import KEPT
from hvd_magics.rank import rank_events


class PeerRing:
    """This rank's place in the ring: its peer host's keeper, and the part on its way there."""

    def __init__(self) -> None:
        #: ``(host, keeper address)`` of the next host; ``None`` until found, ``("", "")`` when
        #: the job has one host (no peer) or the peer has no keeper.
        self.peer: tuple[str, str] | None = None
        #: The part file being sent, which the next copies must not reuse.
        self.sending: Path | None = None
        self.skipped = 0
        self.lock = threading.Lock()

    def find(self, host: str, keeper: str) -> None:
        """Find the peer with every other rank (a collective, once)."""
        if self.peer is not None:
            return
        import torch.distributed as dist
        everyone: list[tuple[str, str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (host, keeper))
        said = [entry for entry in everyone if entry is not None]
        hosts = list(dict.fromkeys(name for name, _ in said))
        if len(hosts) < 2:
            self.peer = ("", "")
            return
        after = hosts[(hosts.index(host) + 1) % len(hosts)]
        self.peer = next(entry for entry in said if entry[0] == after)

    def send(self, path: Path, name: PartName, job: str, secret: str, nbytes: int) -> None:
        """Send the part at ``path`` to the peer in the background (skipped while the one
        before is still on its way)."""
        if not self.peer or not self.peer[1]:
            return
        with self.lock:
            if self.sending is not None:
                self.skipped += 1
                return
            self.sending = path
        threading.Thread(target=self._send, args=(path, name, job, secret, nbytes),
                         daemon=True, name="hvd-magics-keep-peer").start()

    def _send(self, path: Path, name: PartName, job: str, secret: str, nbytes: int) -> None:
        assert self.peer is not None
        host, address = self.peer
        began = time.monotonic()
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                held = put(address, job, secret, name.file, handle, size)
        except OSError:
            held = False
        finally:
            with self.lock:
                self.sending = None
        if held:
            rank_events.emit(KeptEvent(
                kind=KEPT, step=name.step, part=name.part, parts=name.parts, holder=host,
                keeper=address, nbytes=nbytes, copy_s=round(time.monotonic() - began, 4),
                stall_s=0.0, peer=True))
