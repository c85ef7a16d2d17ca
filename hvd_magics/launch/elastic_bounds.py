"""The bounds of an elastic job (``np=MIN:MAX``) said in its own terms when they end it: too few
ranks started within the start timeout, too few left for longer than the elastic timeout, the
ranks re-formed more often than the reset limit allows. Each names the option and the fix."""
from __future__ import annotations

from hvd_magics.options import ElasticSize


def too_few_started(ready: int, size: ElasticSize, start_timeout: float) -> str:
    """Only ``ready`` of the minimum of ``size`` ranks could start in ``start_timeout``."""
    return (f"only {ready} of the minimum of {size.min_np} ranks (np={size}) could start within "
            f"start_timeout={start_timeout:.0f} s (--start-timeout). Fix: add executors or "
            f"cores, lower the minimum, or raise start_timeout.")


def resume_failure(exc: BaseException, size: ElasticSize, elastic_timeout: float) -> str:
    """Why the ranks could not re-form, from Horovod's error ``exc``."""
    from horovod.runner.common.util.timeout import TimeoutException

    if isinstance(exc, TimeoutException):
        return (f"fewer than the minimum of {size.min_np} ranks (np={size}) were left for "
                f"longer than elastic_timeout={elastic_timeout:.0f} s (--elastic-timeout), so "
                f"the job stopped. Fix: add executors, lower the minimum, or raise "
                f"elastic_timeout.")
    return f"the ranks could not re-form: {exc}"


def reset_limit_failure(horovod_message: str, reset_limit: int | None) -> str:
    """Horovod's error message of a job that ended, in the job's terms when it was its
    ``reset_limit``."""
    from horovod.runner.elastic.constants import RESET_LIMIT_EXCEEDED_MESSAGE

    if horovod_message == RESET_LIMIT_EXCEEDED_MESSAGE.format(reset_limit):
        return (f"the ranks had to re-form once more after {reset_limit} resets, which is the "
                f"job's reset_limit={reset_limit} (--reset-limit), so it stopped. Fix: find why "
                f"ranks keep leaving (the resets above name each cause), or raise reset_limit.")
    return horovod_message
