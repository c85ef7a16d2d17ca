"""Write the rows a barrier task received to one local Arrow file per DataFrame (executor side).

The rows arrive as Arrow batches of ``(__source, __key, __s0, __s1, ...)`` (see
:mod:`hvd_magics.launch.dataframe_input`): a row of source ``s`` holds its columns in the struct
``__s<s>``. Each source's rows are appended, as Arrow record batches and never as Python objects, to
``<folder>/<source>.arrow`` in Arrow's file format, which the rank memory-maps
(:class:`hvd_magics.rank.api.shard.Shard`). Before each write the free space of the folder is
checked, so a shard that does not fit fails before training, with the figures, instead of filling
the executor's disk. Each write also counts the null values per column (Arrow keeps the count), so a
job whose columns must hold none (a :class:`HorovodEstimator`'s features and label) is refused when
the tasks meet, without a query of its own over the data.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Mapping

from hvd_magics.errors import ShardSpaceError
from hvd_magics.events import ShardFields
from hvd_magics.protocol import ENV_SHARD_DIR, ROW_COLUMN, SOURCE_COLUMN

#: Free space a shard write leaves on the disk at least.
RESERVE_BYTES = 16 << 20


@dataclass
class ShardFile:
    """One source's shard as the task wrote it."""

    source: int
    path: str
    rows: int = 0
    bytes: int = 0
    #: Seconds spent writing this source's rows, and waiting for Spark's rows (of every source).
    write_s: float = 0.0
    wait_s: float = 0.0
    #: Null values per column of these rows (a column without any is left out).
    nulls: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> ShardFields:
        """This shard as the wire carries it (in a meeting's offers, a ``task_started``)."""
        return ShardFields(source=self.source, path=self.path, rows=self.rows, bytes=self.bytes,
                           write_s=self.write_s, wait_s=self.wait_s, nulls=dict(self.nulls))


def shard_folder(job_id: str, partition: int, job_env: dict[str, str] | None = None) -> Path:
    """The folder of one task's shard files (made here; removed by :func:`remove_shards`):
    under ``HVD_MAGICS_SHARD_DIR`` of the job's ``env`` or of the executor, else the temp dir."""
    root = ((job_env or {}).get(ENV_SHARD_DIR) or os.environ.get(ENV_SHARD_DIR)
            or os.path.join(tempfile.gettempdir(), "hvd_magics", "shards"))
    folder = Path(root) / f"{job_id}-{partition}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _check_space(folder: Path, needed: int, written: int, name: str) -> None:
    free = shutil.disk_usage(folder).free
    if free - needed < RESERVE_BYTES:
        raise ShardSpaceError(
            f"the shard of {name!r} does not fit on {socket.gethostname()}:{folder}: "
            f"{written / 1e6:,.1f} MB written, {needed / 1e6:,.1f} MB more to write, "
            f"{free / 1e6:,.1f} MB free. Fix: more ranks (smaller shards), a smaller DataFrame "
            f"(select only the columns you train on), or point {ENV_SHARD_DIR} at a larger "
            f"disk (HorovodRunner(env=...) or %%horovod --env {ENV_SHARD_DIR}=DIR).")


def write_shards(batches: Iterable[Any], folder: Path, names: dict[int, str]
                 ) -> list[ShardFile]:
    """Append the rows of every source in ``batches`` to its file; return each source's figures.

    ``names`` maps every source index of the job to its name: a source that sent this task no
    rows has a :class:`ShardFile` with ``rows == 0`` and no file.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    files = {index: ShardFile(index, str(folder / f"{index}.arrow")) for index in names}
    writers: dict[int, Any] = {}
    batches = iter(batches)
    waited = 0.0
    try:
        while True:
            began = time.perf_counter()
            batch = next(batches, None)
            waited += time.perf_counter() - began
            if batch is None:
                break
            for index, shard in files.items():
                rows = batch.column(ROW_COLUMN.format(index))
                if len(files) > 1:
                    rows = pc.filter(rows, pc.equal(batch.column(SOURCE_COLUMN), index))
                if len(rows) == 0:
                    continue
                began = time.perf_counter()
                piece = pa.RecordBatch.from_struct_array(rows)
                _check_space(folder, piece.nbytes, shard.bytes, names[index])
                if index not in writers:
                    writers[index] = pa.ipc.new_file(shard.path, piece.schema)
                writers[index].write_batch(piece)
                for name, column in zip(piece.schema.names, piece.columns):
                    if column.null_count:
                        shard.nulls[name] = shard.nulls.get(name, 0) + column.null_count
                shard.rows += piece.num_rows
                shard.bytes += piece.nbytes
                shard.write_s += time.perf_counter() - began
    finally:
        for writer in writers.values():
            writer.close()
    for shard in files.values():
        shard.wait_s = waited
    return [files[index] for index in sorted(files)]


def split_shards(shards: list[ShardFile], parts: int, names: dict[int, str]
                 ) -> list[list[ShardFile]]:
    """Split a task's shards among its ``parts`` ranks: each source's rows in ``parts``
    contiguous runs as even as they can be, one file each (``<source>.<part>.arrow`` beside the
    task's file, which is removed). ``result[part]`` is that rank's shards, in source order;
    ``names`` (as :func:`write_shards`'s) name a DataFrame that does not fit."""
    if parts == 1:
        return [shards]
    import pyarrow as pa

    split: list[list[ShardFile]] = [[] for _ in range(parts)]
    for shard in shards:
        if shard.rows == 0:
            for mine in split:
                mine.append(ShardFile(shard.source, shard.path, wait_s=shard.wait_s))
            continue
        folder = Path(shard.path).parent
        with pa.memory_map(shard.path) as source:
            table = pa.ipc.open_file(source).read_all()
        bounds = [shard.rows * part // parts for part in range(parts + 1)]
        for part, mine in enumerate(split):
            began = time.perf_counter()
            rows = table.slice(bounds[part], bounds[part + 1] - bounds[part])
            piece = ShardFile(shard.source, str(folder / f"{shard.source}.{part}.arrow"),
                              rows=rows.num_rows, bytes=rows.nbytes, wait_s=shard.wait_s)
            _check_space(folder, rows.nbytes, 0, names[shard.source])
            with pa.ipc.new_file(piece.path, table.schema) as writer:
                writer.write_table(rows)
            piece.nulls = {name: column.null_count for name, column in
                           zip(rows.column_names, rows.columns) if column.null_count}
            piece.write_s = shard.write_s + time.perf_counter() - began
            mine.append(piece)
        os.remove(shard.path)
    return split


def remove_shards(folder: Path) -> None:
    """Delete a task's shard files (when its rank has ended)."""
    shutil.rmtree(folder, ignore_errors=True)


def empty_shards(rows_by_task: list[list[int]], names: dict[int, str]) -> str | None:
    """Why a job cannot start when a rank would get no rows of some DataFrame, or ``None``.

    ``rows_by_task[t][s]`` is the rows of source ``s`` that task ``t`` received.
    """
    for index, name in sorted(names.items()):
        counts = [rows[index] for rows in rows_by_task]
        if min(counts) == 0:
            total = sum(counts)
            size = len(counts)
            if total < size:
                return (f"the DataFrame {name!r} has {total} rows, fewer than the {size} ranks: "
                        f"every rank needs at least one. Fix: use np<={max(total, 1)} or more "
                        "data.")
            return (f"the DataFrame {name!r} gave {counts.count(0)} of {size} ranks no rows "
                    f"({total} rows in all). Fix: repartition it (df.repartition(n)) or use "
                    "fewer ranks.")
    return None


def null_values(shards: Iterable[Mapping[str, Any]], no_nulls: dict[int, dict[str, str]]
                ) -> str | None:
    """Why a job cannot start when a column that must hold no nulls holds some, or ``None``.

    ``shards`` are :class:`ShardFile` dicts of any source and task (their ``nulls`` are summed
    per column name, so a DataFrame split in two is counted whole); ``no_nulls`` maps a source
    index to its columns that must hold none, each with what the error calls it
    (``{"label": "labelCol"}``).
    """
    found: dict[str, int] = {}
    roles: dict[str, str] = {}
    for shard in shards:
        for column, role in no_nulls.get(int(shard["source"]), {}).items():
            roles.setdefault(column, role)
            found[column] = found.get(column, 0) + shard.get("nulls", {}).get(column, 0)
    for column, count in found.items():
        if count:
            return (f"{roles[column]} {column!r} has {count} null values. Fix: drop those rows "
                    f"(df.na.drop(subset=[{column!r}])) or fill them (df.na.fill(...)) first.")
    return None
