"""DeepSpeed in a rank: a training script run as pyspark's ``DeepspeedTorchDistributor`` runs it
(:class:`hvd_magics.DeepspeedTorchDistributor`). A training function needs nothing of ours:
``deepspeed.initialize`` reads the job's torchrun environment. An engine's checkpoints go through
ours: :mod:`hvd_magics.rank.api.deepspeed_checkpoint`."""
from __future__ import annotations

import json
import os
import tempfile

from hvd_magics.rank.torch_entry import run_script


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
