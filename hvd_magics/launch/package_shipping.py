"""hvd_magics travels with every job to executors whose Python lacks it (or has another version).

The package's own sources, and those of the ``cloudpickle`` the driver pickles jobs with (pure
Python; an executor that has only pyspark has pyspark's copy under another name, and a pickle
names the module it needs), are zipped once per content (``hvd_magics-<version>-<hash>.zip`` in
the user's cache) and handed to Spark as a Python file of the session: ``SparkContext.addPyFile``
on a classic session, ``spark.addArtifacts(..., pyfile=True)`` on Spark Connect. Spark puts it on
the executors' Python path ahead of their site-packages, so the barrier tasks import the
driver's own version, and each task's rank processes get it through ``PYTHONPATH``
(:func:`hvd_magics.task.supervisor.rank_environment` puts the package's root there, which is the
zip itself when it was imported from one). It is sent once per Spark application (or Connect
session) and content; nothing is sent to a local master, whose executors run this machine's
Python (:func:`~hvd_magics.launch.spark_session.local_workers_use_this_python`).

The frameworks the ranks import (Horovod, PyTorch, TensorFlow) and hvd_magics' own few dependencies
(numpy, pyarrow; psutil where installed) must still be on the executors, or travel in a shipped
environment.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, cast

import cloudpickle

import hvd_magics
from hvd_magics.launch.spark_session import executors_run_this_python, send_once

def cache_folder(name: str) -> Path:
    """``$XDG_CACHE_HOME/hvd_magics/<name>`` (``~/.cache/...`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hvd_magics" / name


def shipped_packages() -> list[Path]:
    """The folders of the packages that travel: hvd_magics and cloudpickle, as they run here."""
    # regular packages imported from their files: each has its __file__
    return [Path(cast(str, module.__file__)).resolve().parent
            for module in (hvd_magics, cloudpickle)]


def _sources(roots: list[Path]) -> list[tuple[Path, str]]:
    """Each source file and its name in the zip (``hvd_magics/...``, ``cloudpickle/...``)."""
    return [(path, f"{root.name}/{path.relative_to(root).as_posix()}") for root in roots
            for path in sorted(root.rglob("*.py")) if "__pycache__" not in path.parts]


def package_zip(cache: Path | None = None) -> Path:
    """The zip of the running package's sources, built once per content.

    ``cache``: where the zips are kept (``$XDG_CACHE_HOME/hvd_magics/ship``, or
    ``~/.cache/...``, by default).
    """
    sources = _sources(shipped_packages())
    digest = hashlib.sha256()
    for path, name in sources:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    name = f"hvd_magics-{hvd_magics.__version__}-{digest.hexdigest()[:16]}.zip"
    folder = cache or cache_folder("ship")
    target = folder / name
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as part:
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as archive:
            for path, name in sources:
                archive.write(path, name)
    os.replace(part.name, target)  # whole or absent, also when two kernels build it at once
    return target


def ship_package(spark: Any) -> Path | None:
    """Send the package's zip to ``spark``'s executors unless they already have it (sent before
    to this application, or a local master's); return the zip when it was sent now."""
    if executors_run_this_python(spark):
        return None
    archive = package_zip()
    return archive if send_once(spark, str(archive), "pyfile") else None
