"""hvd_magics: run a notebook cell as a distributed Horovod job on Spark.

``%load_ext hvd_magics`` registers ``%%horovod`` and ``%hvd_timeline``; :class:`HorovodRunner`
is the Python API beneath them, compatible with Databricks' ``sparkdl.HorovodRunner``.
"""
from __future__ import annotations

from hvd_magics.errors import (HorovodJobError, NotEnoughSlotsError, PayloadError,
                               StartTimeoutError)
from hvd_magics.launcher import HorovodRunner, last_run
from hvd_magics.reporting import log_to_driver
from hvd_magics.run_record import RunRecord

__version__ = "0.1.0"

__all__ = ["HorovodJobError", "HorovodRunner", "NotEnoughSlotsError", "PayloadError", "RunRecord",
           "StartTimeoutError", "last_run", "load_ipython_extension", "log_to_driver"]


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's own type
    """Register ``%%horovod`` and ``%hvd_timeline`` (``%load_ext hvd_magics``)."""
    from hvd_magics.magics import HorovodMagics

    ipython.register_magics(HorovodMagics)
