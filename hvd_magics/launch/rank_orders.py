"""What a Spark backend tells its ranks' tasks over the job's event channel, and what it hears
of them: a warm pool's cells, interrupts, end and dropped shards, requests for stacks,
preemption notices and link probes; when each task was last heard, whether every connection has
ended, and what a start timeout says of tasks never heard."""
from __future__ import annotations

import base64
from typing import Any
from collections.abc import Sequence

from hvd_magics.channel import EventServer
from hvd_magics.events import (DropShardsOrder, EndPoolOrder, InterruptCellOrder, Order,
                               PreemptOrder, RunCellOrder, TakeStacksOrder)
from hvd_magics.protocol import (DROP_SHARDS, END_POOL, INTERRUPT_CELL, PREEMPT, RUN_CELL,
                                 TAKE_STACKS)


class RankOrders:
    """The event channel's side of a backend whose ``np`` ranks' tasks connect to ``_server``
    (``None``: the job has no channel, and nobody is told anything)."""

    np: int
    _server: EventServer | None

    def _order_all(self, order: Order) -> None:
        if self._server is not None:
            for rank in range(self.np):
                self._server.send_order(rank, order)

    def send_cell(self, frames: Sequence[bytes]) -> None:
        """A warm pool: give each rank its next cell (``frames[rank]``, one stdin frame, as an
        order)."""
        if self._server is not None:
            for rank, frame in enumerate(frames):
                self._server.send_order(rank, RunCellOrder(
                    kind=RUN_CELL, frame=base64.b64encode(frame).decode()))

    def drop_shards(self, deal: str) -> None:
        """A warm pool: the ranks' tasks delete the shards of ``deal``."""
        self._order_all(DropShardsOrder(kind=DROP_SHARDS, deal=deal))

    @property
    def channel_secret(self) -> bytes:
        """The secret of the job's event channel (a warm pool's dealers sign with it too)."""
        if self._server is None:
            raise RuntimeError("the job has no event channel")
        return self._server.address.secret

    def request_stacks(self, request: str) -> None:
        """Ask every rank for its stacks (``stacks`` events carrying ``request``); without an
        event channel (``HVD_MAGICS_LIVE=0``) nobody answers."""
        self._order_all(TakeStacksOrder(kind=TAKE_STACKS, request=request))

    def interrupt_cell(self) -> None:
        """A warm pool: interrupt the cell every rank runs."""
        self._order_all(InterruptCellOrder(kind=INTERRUPT_CELL))

    def end_pool(self) -> None:
        """A warm pool: end the ranks' input; they leave Horovod together and exit."""
        self._order_all(EndPoolOrder(kind=END_POOL))

    def preempt(self, at: int, notice: str) -> None:
        """Tell every rank its executors are being taken away: ``checkpoint.preempting()`` is
        True from its call ``at`` on."""
        self._order_all(PreemptOrder(kind=PREEMPT, at=at, notice=notice))

    def probe_link(self, rank: int, order: dict[str, Any]) -> bool:
        """Send the link probe ``order`` to the task of ``rank`` over the event channel."""
        return self._server is not None and self._server.send_order(rank, order)

    def heard_ago(self, now: float) -> dict[int, float]:
        """Per rank whose task reached the event channel: seconds since its last frame."""
        if self._server is None:
            return {}
        return {rank: now - heard for rank, heard in list(self._server.heard.items())}

    @property
    def drained(self) -> bool:
        """Whether every rank's event connection has ended (all it sent has arrived)."""
        return self._server is None or self._server.open_connections == 0

    def silence_note(self, ranks: list[int]) -> str:
        """What a start timeout says of ``ranks``, whose tasks never reached the channel."""
        if not ranks or self._server is None:
            return ""
        address = self._server.address
        note = (f"Nothing reached the notebook's event channel ({address.host}:{address.port}) "
                f"from the Spark tasks of ranks {', '.join(map(str, ranks))}: Spark did not run "
                "them, or they cannot reach this machine")
        if self._server.rejected:
            note += (f"; the channel closed {self._server.rejected} connections that did not "
                     "authenticate (another process connecting to it?)")
        return note + ". "
