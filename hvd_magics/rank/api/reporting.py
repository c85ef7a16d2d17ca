"""What code running on a rank can call to talk to the notebook (a no-op outside a rank)."""
from __future__ import annotations

from hvd_magics.events import LogEvent
from hvd_magics.protocol import LOG
from hvd_magics.rank import rank_events


def log_to_driver(message: str) -> None:
    """Show ``message`` on the driver, also with ``driver_log_verbosity="log_callback_only"``.

    Outside a rank process it prints the message, so the same code runs on a laptop.
    """
    if rank_events.active():
        rank_events.emit(LogEvent(kind=LOG, text=str(message)))
    else:
        print(message)
