"""A job's Spark stage kept out of what would disturb it or the user's cells while it runs:
Spark's console bar (it would draw the stage into the cell: a pool's and a background job's into
whichever cell runs then) and, for a warm pool's or a background job's stage, pyspark's Ctrl-C
handler (an interrupt of another cell cancels every Spark job). Classic Spark only."""
from __future__ import annotations

from typing import Any

from hvd_magics.launch import console_bar, interrupt_guard


class StageGuard:
    """What one stage holds off until it ends (:meth:`hold`, then :meth:`release`)."""

    def __init__(self) -> None:
        #: The stage is kept from pyspark's Ctrl-C handler.
        self.interrupts_held = False
        #: Spark's console bar is paused for the stage.
        self.bar_paused = False

    def hold(self, sc: Any, group: str, interrupts: bool) -> None:
        """Pause the console bar of ``sc``; with ``interrupts`` (a pool's or background job's
        stage, of job group ``group``), keep it from other cells' interrupts too."""
        if not self.bar_paused:
            self.bar_paused = console_bar.pause(sc)
        if interrupts and not self.interrupts_held:
            self.interrupts_held = True
            interrupt_guard.protect(sc, group)

    def release(self, group: str) -> None:
        """The stage of job group ``group`` ended: let go of what :meth:`hold` held."""
        if self.interrupts_held:
            self.interrupts_held = False
            interrupt_guard.release(group)
        if self.bar_paused:
            self.bar_paused = False
            console_bar.resume()
