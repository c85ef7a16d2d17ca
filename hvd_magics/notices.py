"""One line the notebook shows from hvd_magics itself (on stderr, as a job's other notes before
its ranks start): ``hvd_magics: ...``."""
from __future__ import annotations

import sys


def say(text: str, redraw: bool = False) -> None:
    """Show ``hvd_magics: text``; ``redraw``: a progress line that the next one replaces."""
    print(f"\rhvd_magics: {text}" if redraw else f"hvd_magics: {text}",
          end="" if redraw else "\n", file=sys.stderr, flush=True)
