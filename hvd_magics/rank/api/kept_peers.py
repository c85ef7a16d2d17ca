"""The ring of a sharded job's hosts (:mod:`hvd_magics.rank.api.keeping`): each rank's part of every
kept step also held by the next host's keeper, so that a lost host's parts are on its peer.

The peer is found without waiting: every rank says its host and its host's keeper in the job's
``torch.distributed`` store at its first sharded step, and once every rank has (at the next
step, as a rule), a host's peer is the next host in the ranks' order (the last host's, the
first). A part is sent in
the background once in place here; when the link does not keep up (the step before is still on
its way), that step's peer copy is skipped, and the driver's record says how far the peers lag.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from hvd_magics.common.kept_steps import PartName
from hvd_magics.common.step_keeper_wire import put
from hvd_magics.events import KeptEvent
from hvd_magics.protocol import KEPT
from hvd_magics.rank import rank_events


#: The store's keys of the ranks' hosts and keepers (``<prefix><rank>``).
_STORE_PREFIX = "hvd_magics/keep/"


class PeerRing:
    """This rank's place in the ring: its peer host's keeper, and the part on its way there."""

    def __init__(self) -> None:
        #: ``(host, keeper address)`` of the next host; ``None`` until found, ``("", "")`` when
        #: the job has one host (no peer) or the peer has no keeper.
        self.peer: tuple[str, str] | None = None
        #: The part file being sent, which the next copies must not reuse.
        self.sending: Path | None = None
        self.skipped = 0
        #: Whether this rank said its host and keeper in the job's store.
        self.said = False
        self.lock = threading.Lock()

    def find(self, host: str, keeper: str) -> None:
        """Say this rank's host and keeper in the job's store, and find the peer once every
        rank has said theirs (never waiting: a rank that has not kept a step yet leaves this
        step without a peer copy, and a rank that never keeps leaves the ring unmade)."""
        if self.peer is not None:
            return
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store
        store, size = _get_default_store(), dist.get_world_size()
        keys = [f"{_STORE_PREFIX}{rank}" for rank in range(size)]
        if not self.said:
            store.set(keys[dist.get_rank()], json.dumps([host, keeper]))
            self.said = True
        if not store.check(keys):
            return
        said = [tuple(json.loads(value)) for value in store.multi_get(keys)]
        hosts = list(dict.fromkeys(name for name, _ in said))
        if len(hosts) < 2:
            self.peer = ("", "")
            return
        after = hosts[(hosts.index(host) + 1) % len(hosts)]
        self.peer = next((name, address) for name, address in said if name == after)

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
