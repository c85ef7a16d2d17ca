"""hvd_magics: run a notebook cell as a distributed Horovod job on Spark.

``%load_ext hvd_magics`` registers ``%%horovod``, ``%hvd_pool``, ``%hvd_stacks``,
``%hvd_timeline`` and ``%hvd_mlflow``; :class:`HorovodRunner` is the Python API beneath them,
compatible with Databricks' ``sparkdl.HorovodRunner`` (with :class:`HorovodPool`,
:class:`TorchDistributor` and :class:`HorovodEstimator` beside it).

The package is split by where code runs, each floor importing only its own and the ones below
(``tests/unit/test_layout.py`` holds the table): ``notebook/`` (the kernel's magics), ``estimator/``
(the MLlib estimator, on the driver), ``job/`` (the driver while a job runs), ``launch/`` (starting
ranks and bringing them data), ``task/`` (a Spark task supervising its rank), ``rank/`` (inside a
rank process); ``protocol``, ``channel``, ``options``, ``result_codec`` and ``errors`` are shared by
all. The public names below are loaded on first use, so that a rank importing ``hvd_magics.rank``
never loads the driver side.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_PUBLIC = {
    "HorovodRunner": "hvd_magics.job.runner",
    "HorovodPool": "hvd_magics.job.pool",
    "TorchDistributor": "hvd_magics.dropins.torch_distributor",
    "distributed": "hvd_magics.dropins.distributed",
    "DeepspeedTorchDistributor": "hvd_magics.dropins.deepspeed_distributor",
    "BackgroundJob": "hvd_magics.job.background",
    "jobs": "hvd_magics.job.background",
    "rank_namespace": "hvd_magics.rank.cell_runner",
    "HorovodEstimator": "hvd_magics.estimator",
    "HorovodModel": "hvd_magics.estimator",
    "last_run": "hvd_magics.job.runner",
    "RunRecord": "hvd_magics.job.records.run_record",
    "HorovodMagicsError": "hvd_magics.errors",
    "HorovodMagicsWarning": "hvd_magics.errors",
    "HorovodJobError": "hvd_magics.errors",
    "JobInterrupted": "hvd_magics.errors",
    "NotEnoughSlotsError": "hvd_magics.errors",
    "PayloadError": "hvd_magics.errors",
    "DataRefused": "hvd_magics.errors",
    "PoolError": "hvd_magics.errors",
    "MlflowMissing": "hvd_magics.errors",
    "StartTimeoutError": "hvd_magics.errors",
    "EnvironmentNotShippable": "hvd_magics.errors",
    "JobTimeoutError": "hvd_magics.errors",
    "log_to_driver": "hvd_magics.rank.api.reporting",
    "progress": "hvd_magics.rank.api",  # the module hvd_magics.rank.api.progress
    "checkpoint": "hvd_magics.rank.api",  # the module hvd_magics.rank.api.checkpoint
    "attempt": "hvd_magics.rank.api.checkpoint",
    "alone": "hvd_magics.rank.integrations.guards",
    "ship_environment": "hvd_magics.job.environment",
}

__all__ = sorted([*_PUBLIC, "load_ipython_extension"])


#: Modules the docs name at the package's top, imported where they live (``import
#: hvd_magics.checkpoint`` failed with ModuleNotFoundError: only ``from hvd_magics import
#: checkpoint`` worked).
_MODULES = {"hvd_magics.checkpoint": "hvd_magics.rank.api.checkpoint",
            "hvd_magics.progress": "hvd_magics.rank.api.progress"}


class _ModuleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each name of :data:`_MODULES` as the module it names, loaded on first use."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201 - importlib's
        return importlib.util.spec_from_loader(name, self) if name in _MODULES else None

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return importlib.import_module(_MODULES[spec.name])

    def exec_module(self, module) -> None:  # noqa: ANN001 - loaded by create_module
        return None


if not any(isinstance(finder, _ModuleAlias) for finder in sys.meta_path):
    sys.meta_path.append(_ModuleAlias())


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'hvd_magics' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name, None)
    if value is None:  # a submodule (progress)
        value = importlib.import_module(f"{module}.{name}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's own type
    """Register ``%%horovod``, ``%hvd_pool``, ``%hvd_timeline`` and ``%hvd_mlflow``
    (``%load_ext hvd_magics``)."""
    from hvd_magics.notebook.magics import HorovodMagics

    ipython.register_magics(HorovodMagics)
