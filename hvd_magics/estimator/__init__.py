"""An MLlib Estimator and Model for Horovod training on Spark DataFrames (the driver side).

``from hvd_magics.estimator import HorovodEstimator, HorovodModel``. The ranks' side of a fit is
:mod:`hvd_magics.rank.fits.estimator_fit`; the Spark tasks' side of ``transform`` is
:mod:`hvd_magics.task.predict`.
"""
from hvd_magics.estimator.estimator import HorovodEstimator
from hvd_magics.estimator.model import HorovodModel

__all__ = ["HorovodEstimator", "HorovodModel"]
