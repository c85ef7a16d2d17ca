"""The slots of an elastic job (``np=MIN:MAX``) as Horovod's elastic driver discovers them: each
Spark task attempt is one host with one slot, ready once it offers itself on the event channel,
ended when its rank exits or its channel closes (its executor was lost)."""
from __future__ import annotations

import threading
import time

from hvd_magics.events import Event
from hvd_magics.protocol import CHANNEL_CLOSED, EXIT, SLOT_OFFER
from hvd_magics.rank_names import TASK, rank_named
from hvd_magics.task.elastic_task import slot_host_prefix

#: Exit code recorded for a rank whose task vanished without reporting one.
LOST_CODE = -1
#: How often the waits of an elastic job look again at what they wait for.
POLL_S = 0.1


class TaskSlots:
    """The slots Horovod's elastic driver may use: tasks that offered themselves and whose rank
    has not ended. It is the driver's host discovery (each task attempt is one host, one slot).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: dict[str, int] = {}  # slot host -> task (partition)
        self._task_host: dict[int, str] = {}  # task -> its current slot host
        self._exits: dict[str, int] = {}  # slot host -> exit code of its rank
        self.offers = 0

    # -- HostDiscovery -------------------------------------------------------------------------
    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """``{slot host: 1}`` for every task ready to run a rank (Horovod's discovery API)."""
        with self._cond:
            return {host: 1 for host in self._ready}

    # -- what the tasks say --------------------------------------------------------------------
    def offer(self, slot_host: str, task: int) -> None:
        """A task is ready to run a rank under the name ``slot_host``."""
        with self._cond:
            self._ready[slot_host] = task
            self._task_host[task] = slot_host
            self.offers += 1
            self._cond.notify_all()

    def ended(self, task: int, code: int) -> str | None:
        """The rank (or the whole task) of ``task`` ended with ``code``; return its slot host
        (``None`` when the task had not offered a slot, or its end was known already)."""
        with self._cond:
            host = self._task_host.get(task)
            if host is None or host in self._exits:
                return None
            if code != 0:  # a rank that ended well stays, lest its end look like a lost host
                self._ready.pop(host, None)
            self._exits[host] = code
            self._cond.notify_all()
            return host

    def learn(self, event: Event) -> str | None:
        """What a task's event says of its slot: offered, or ended (its rank's exit, its
        channel's end); a slot's end that makes the ranks re-form says why (else ``None``)."""
        task = event.get("rank")
        if task is None:  # every task's event names it (its channel stamps it)
            return None
        if event["kind"] == SLOT_OFFER:
            self.offer(event["slot_host"], task)
        elif event["kind"] == EXIT:
            code = event.get("code")
            if self.ended(task, code if code is not None else LOST_CODE) and code:
                return f"the rank of {rank_named(task, TASK)} exited with code {code}"
        elif event["kind"] == CHANNEL_CLOSED:
            clean = event.get("clean")
            if self.ended(task, 0 if clean else LOST_CODE) and not clean:
                return f"{rank_named(task, TASK)} was lost (its executor went away)"
        return None

    # -- what the driver asks ------------------------------------------------------------------
    def tasks_on(self, host: str) -> list[int]:
        """The tasks whose slot is on ``host``, an address."""
        prefix = slot_host_prefix(host)
        with self._cond:
            return [task for task, slot in self._task_host.items() if slot.startswith(prefix)]

    def task_of(self, slot_host: str) -> int | None:
        with self._cond:
            return self._ready.get(slot_host)

    @property
    def ready(self) -> int:
        with self._cond:
            return len(self._ready)

    def wait_ready(self, count: int, deadline: float, stop: threading.Event) -> int:
        """Wait until ``count`` slots are ready (or the deadline, or ``stop``); return how many."""
        with self._cond:
            while len(self._ready) < count and not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, POLL_S))
            return len(self._ready)

    def wait_exit(self, slot_host: str, stop_when: list[threading.Event]) -> int | None:
        """The exit code of the rank on ``slot_host``; ``None`` as soon as one of
        ``stop_when`` is set first."""
        with self._cond:
            while slot_host not in self._exits:
                if any(event.is_set() for event in stop_when):
                    return None
                self._cond.wait(POLL_S)
            return self._exits[slot_host]

    def exit_of(self, slot_host: str, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: slot_host in self._exits, timeout)
            return self._exits.get(slot_host)
