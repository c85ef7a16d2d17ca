"""What a :class:`hvd_magics.TorchDistributor` job runs on each rank: the user's function with
its positional arguments, or a Python file with its command-line arguments, as torchrun would.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
from typing import Any, Callable


def call_with(function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``function(*args, **kwargs)``; what it returns on rank 0 comes back to the notebook."""
    return function(*args, **kwargs)


def run_script(path: str, argv: list[str]) -> None:
    """Run the file ``path`` as ``__main__`` with ``sys.argv = [path, *argv]`` (``python path
    argv...``); a file returns nothing."""
    sys.argv = [path, *argv]
    runpy.run_path(path, run_name="__main__")


def run_deepspeed_script(path: str, argv: list[str], config: str | dict | None) -> None:
    """Run the file ``path`` as pyspark's ``DeepspeedTorchDistributor`` runs it: its arguments,
    then ``--deepspeed`` and ``--deepspeed_config PATH`` (a dict written to a JSON file here, on
    the rank's host, where the script reads it; none: DeepSpeed's defaults)."""
    if isinstance(config, dict):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False,
                                         encoding="utf-8") as file:
            json.dump(config, file)
        config = file.name
    extra = ["--deepspeed"] + (["--deepspeed_config", os.fspath(config)] if config else [])
    run_script(path, [*argv, *extra])
