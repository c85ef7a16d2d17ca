"""TensorBoard event files for a fit's metrics: ``<model_dir>/events/train`` and
``.../validation``, with the tags Keras's TensorBoard callback uses (``epoch_loss``,
``epoch_accuracy``), so that ``tensorboard --logdir <model_dir>/events`` shows both curves.

The files are written here (TFRecord framing, TensorBoard's protobuf messages) rather than with
TensorBoard's writer, which imports TensorFlow on first use: three seconds in a PyTorch rank.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, BinaryIO

EVENTS_FOLDER = "events"
VALIDATION_PREFIX = "val_"
_CRC32C_POLY = 0x82F63B78
_CRC_TABLE: list[int] = []


def _crc32c(data: bytes) -> int:
    if not _CRC_TABLE:
        for byte in range(256):
            crc = byte
            for _ in range(8):
                crc = (crc >> 1) ^ _CRC32C_POLY if crc & 1 else crc >> 1
            _CRC_TABLE.append(crc)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_record(handle: BinaryIO, data: bytes) -> None:
    """One TFRecord: length, its checksum, the data, its checksum."""
    length = struct.pack("<Q", len(data))
    handle.write(length + struct.pack("<I", _masked_crc(length)) + data
                 + struct.pack("<I", _masked_crc(data)))


class EventFiles:
    """Append one point per epoch to the training and validation event files."""

    def __init__(self, model_dir: str | os.PathLike) -> None:
        self._root = Path(model_dir) / EVENTS_FOLDER
        self._files: dict[str, BinaryIO] = {}

    def _file(self, split: str) -> BinaryIO:
        if split not in self._files:
            from tensorboard.compat.proto.event_pb2 import Event

            folder = self._root / split
            folder.mkdir(parents=True, exist_ok=True)
            name = (f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
                    f"{os.getpid()}.{len(self._files)}")
            handle = open(folder / name, "ab")  # noqa: SIM115 - closed in close()
            write_record(handle, Event(wall_time=time.time(),
                                       file_version="brain.Event:2").SerializeToString())
            self._files[split] = handle
        return self._files[split]

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
            handle = self._file(split)
            write_record(handle, Event(wall_time=time.time(), step=epoch,
                                       summary=Summary(value=values)).SerializeToString())
            handle.flush()

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
