"""A running job as another thread sees it: what :func:`hvd_magics.job.runner.launch` made for
it, and a way to stop it (a background job's handle holds one)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from hvd_magics.launch.backend import Backend

#: How long to wait for the Spark job / rank processes to end after a stop...
STOP_WAIT_S = 30.0
#: ...and how long a handle's ``stop()`` waits for the whole wind-down (that wait, then the
#: clean-up and the record).
HANDLE_STOP_WAIT_S = 2 * STOP_WAIT_S


@dataclass
class LiveJob:
    """Filled in by ``launch`` as the job starts; read by the thread that holds the handle.

    Attributes
    ----------
    job : JobState or None
        The driver's picture of the job (its ranks, their stacks), once it started.
    backend : Backend or None
        Where the ranks run (what takes their stacks).
    record : RunRecord or None
        The job's record (its status is ``running`` until it ended).
    stop : threading.Event
        Set to stop the job: its watch loop ends it as an interrupt would.
    started : threading.Event
        Set once the ranks are being started (the slots were checked, the stage submitted).
    """

    job: Any = None
    backend: Backend | None = None
    record: Any = None
    stop: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
