"""TensorBoard event files for a fit's metrics: ``<model_dir>/events/train`` and
``.../validation``, with the tags Keras's TensorBoard callback uses (``epoch_loss``,
``epoch_accuracy``), so that ``tensorboard --logdir <model_dir>/events`` shows both curves."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

EVENTS_FOLDER = "events"
VALIDATION_PREFIX = "val_"


class EventFiles:
    """Append one point per epoch to the training and validation event files."""

    def __init__(self, model_dir: str | os.PathLike) -> None:
        self._root = Path(model_dir) / EVENTS_FOLDER
        self._writers: dict[str, Any] = {}

    def _writer(self, split: str) -> Any:
        if split not in self._writers:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            folder = self._root / split
            folder.mkdir(parents=True, exist_ok=True)
            self._writers[split] = EventFileWriter(str(folder))
        return self._writers[split]

    def write(self, epoch: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` (``val_*`` go to the validation file) at step ``epoch``."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        splits: dict[str, list[Any]] = {}
        for name, value in metrics.items():
            split = "validation" if name.startswith(VALIDATION_PREFIX) else "train"
            tag = "epoch_" + name.removeprefix(VALIDATION_PREFIX)
            splits.setdefault(split, []).append(Summary.Value(tag=tag, simple_value=float(value)))
        for split, values in splits.items():
            writer = self._writer(split)
            writer.add_event(Event(wall_time=time.time(), step=epoch,
                                   summary=Summary(value=values)))
            writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
