"""MLlib ``save``/``load`` for the estimator and its model, on classic and Spark Connect sessions.

A saved instance is DefaultParamsWriter's ``metadata`` (the JSON params, the class, extra facts)
beside a ``hvd_magics`` Parquet folder of named binary blobs (pickled object params, the model's
bytes). Both are written through Spark, so any path Spark can write to works (local, HDFS, S3,
DBFS), and a ``PipelineModel`` that contains our model saves and loads it like any stage.
"""
from __future__ import annotations

import shutil
from typing import Any
from collections.abc import Callable

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

BLOB_FOLDER = "hvd_magics"


def _blob_path(path: str) -> str:
    return path.rstrip("/") + "/" + BLOB_FOLDER


class BlobWriter(MLWriter):
    """Write ``instance``'s JSON params (all but ``skip``), ``extra`` metadata and the ``blobs``
    that ``content()`` gives (``(blobs, extra)``, asked for at save time)."""

    def __init__(self, instance: Any, skip: tuple[str, ...],
                 content: Callable[[], tuple[dict[str, bytes], dict[str, Any]]]) -> None:
        super().__init__()
        self.instance, self.skip, self.content = instance, skip, content

    def _handleOverwrite(self, path: str) -> None:
        local = path.removeprefix("file:")
        if "://" not in local:
            shutil.rmtree(local, ignore_errors=True)
        else:
            super()._handleOverwrite(path)

    def saveImpl(self, path: str) -> None:
        blobs, extra = self.content()
        params = {p.name: v for p, v in self.instance._paramMap.items() if p.name not in self.skip}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata=extra, paramMap=params)
        rows = [(name, bytearray(blob)) for name, blob in blobs.items()]
        self.sparkSession.createDataFrame(rows or [("", bytearray())], "name string, blob binary") \
            .coalesce(1).write.parquet(_blob_path(path))


class BlobReader(MLReader):
    """Read what :class:`BlobWriter` wrote: ``build(metadata, blobs)`` makes the instance, whose
    JSON params are then set from the metadata."""

    def __init__(self, build: Callable[[dict[str, Any], dict[str, bytes]], Any],
                 skip: tuple[str, ...]) -> None:
        super().__init__()
        self.build, self.skip = build, skip

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        rows = self.sparkSession.read.parquet(_blob_path(path)).collect()
        blobs = {row["name"]: bytes(row["blob"]) for row in rows if row["name"]}
        instance = self.build(metadata, blobs)
        DefaultParamsReader.getAndSetParams(instance, metadata, skipParams=list(self.skip))
        instance._resetUid(metadata["uid"])
        return instance
