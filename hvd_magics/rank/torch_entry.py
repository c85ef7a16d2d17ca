"""What a :class:`hvd_magics.TorchDistributor` job runs on each rank: the user's function with
its positional arguments, or a Python file with its command-line arguments, as torchrun would.
"""
from __future__ import annotations

import runpy
import sys
from typing import Any
from collections.abc import Callable


def call_with(function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``function(*args, **kwargs)``; what it returns on rank 0 comes back to the notebook."""
    return function(*args, **kwargs)


def run_script(path: str, argv: list[str]) -> None:
    """Run the file ``path`` as ``__main__`` with ``sys.argv = [path, *argv]`` (``python path
    argv...``); a file returns nothing."""
    sys.argv = [path, *argv]
    runpy.run_path(path, run_name="__main__")
