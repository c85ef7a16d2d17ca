"""Each rank's memory, as its step splits carry it: its GPU's
(:mod:`hvd_magics.rank.instruments.gpu_memory`) and its host memory's, with the part of a sharded
model's parameters it holds (:mod:`hvd_magics.rank.instruments.rank_memory`); the highest peak
each reported is kept."""
from __future__ import annotations

from typing import Any

from hvd_magics.common.sizes import byte_size


class MemoryReadings:
    """The ranks' latest memory readings, each with the highest peak reported.

    Attributes
    ----------
    gpu : dict
        Rank -> its GPU's latest reading (``used``, ``total``, ``peak``, ``util``).
    host : dict
        Rank -> its host memory's latest reading (``rss``, ``peak``; ``params`` and
        ``params_full`` in sharded training).
    """

    def __init__(self) -> None:
        self.gpu: dict[int, dict[str, Any]] = {}
        self.host: dict[int, dict[str, Any]] = {}

    def observe(self, rank: int, event: dict[str, Any]) -> None:
        """Take the readings of one rank's ``step_split`` event (none: nothing changes)."""
        if event.get("gpu"):
            peak = max(event["gpu"].get("peak") or 0, self.gpu.get(rank, {}).get("peak") or 0)
            self.gpu[rank] = {**event["gpu"], "peak": peak}
        if event.get("memory"):
            peak = max(event["memory"].get("peak") or 0,
                       self.host.get(rank, {}).get("peak") or 0)
            self.host[rank] = {**event["memory"], "peak": peak}

    def on_gpu(self, rank: int) -> bool:
        """Whether ``rank`` reported a GPU."""
        return rank in self.gpu

    def columns(self, rank: int) -> dict[str, int]:
        """``gpu_peak_bytes``, ``peak_bytes`` (host memory), and ``param_bytes`` and
        ``params_full_bytes`` of a sharded model, for the record's row of ``rank``."""
        columns = {"gpu_peak_bytes": self.gpu[rank]["peak"]} if rank in self.gpu else {}
        memory = self.host.get(rank) or {}
        if memory.get("peak"):
            columns["peak_bytes"] = memory["peak"]
        if memory.get("params_full"):
            columns.update(param_bytes=memory["params"], params_full_bytes=memory["params_full"])
        return columns

    def text(self, rank: int) -> str:
        """``"GPU 3.1/80 GB (peak 4.0), 97% busy"`` on a GPU rank, ``"memory 1.2 GB (peak
        1.5)"`` on a CPU rank, with ``" · parameters 12 MB of 24 MB"`` (its shard of the
        whole) in sharded training; ``""`` before the rank reported any."""
        gb = 1024 ** 3
        gpu, memory = self.gpu.get(rank), self.host.get(rank) or {}
        if gpu:
            busy = f", {gpu['util']}% busy" if gpu.get("util") is not None else ""
            text = (f"GPU {gpu['used'] / gb:.1f}/{gpu['total'] / gb:.0f} GB "
                    f"(peak {gpu['peak'] / gb:.1f}){busy}")
        elif memory.get("rss"):
            text = f"memory {memory['rss'] / gb:.1f} GB (peak {memory['peak'] / gb:.1f})"
        else:
            return ""
        if memory.get("params_full"):
            text += (f" · parameters {byte_size(memory['params'], binary=True)} of "
                     f"{byte_size(memory['params_full'], binary=True)}")
        return text
