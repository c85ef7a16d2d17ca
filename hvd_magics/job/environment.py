"""``hvd_magics.ship_environment()``: from now on, this session's jobs run their ranks in the
notebook's own Python environment, packed and unpacked by Spark on every executor (see
:mod:`hvd_magics.launch.environment_shipping`)."""
from __future__ import annotations

import os

from hvd_magics.job.session import SESSION
from hvd_magics.launch.environment_shipping import (DEFAULT_LIMIT_GB, EnvironmentChoice,
                                                    environment_facts, packed_environment)
from hvd_magics.launch.spark_session import active_session, executors_run_this_python
from hvd_magics.notices import say


def ship_environment(prefix: str | os.PathLike | bool | None = None, *,
                     limit_gb: float = DEFAULT_LIMIT_GB) -> EnvironmentChoice | None:
    """Run every later job's ranks in this notebook's Python environment, sent to the executors.

    Install on the driver (``%pip install ...`` in the notebook), run on the cluster: the
    environment is packed now (venv-pack for a venv, conda-pack for a conda environment) and
    each job on a cluster sends it once per Spark application; a later ``%pip install`` is seen
    by the next job, which packs and sends the new environment and says so. Nothing is shipped
    to a local master (its executors run this very Python).

    Parameters
    ----------
    prefix : str, path, bool or None
        The environment (default: the kernel's own, ``sys.prefix``). ``False`` stops shipping.
    limit_gb : float
        Refuse an environment larger than this, unpacked (every executor downloads and unpacks
        it).

    Returns
    -------
    EnvironmentChoice or None
        What is shipped (``None`` after ``ship_environment(False)``).

    Raises
    ------
    hvd_magics.errors.EnvironmentNotShippable
        Not a venv or conda environment, an editable install that cannot travel, or too large.
    """
    if prefix is False:
        SESSION.environment = None
        say("the notebook's environment is no longer shipped: the ranks run in the executors' "
            "own Python")
        return None
    where = None if prefix is True or prefix is None else os.fspath(prefix)
    facts = environment_facts(where)
    choice = EnvironmentChoice(where, limit_gb)
    spark = active_session()
    if spark is not None and executors_run_this_python(spark):
        say(f"the session's master is {spark.sparkContext.master}: its executors run this very "
            "Python, so nothing is packed or sent to them; a job on a cluster session will ship "
            f"{facts.describe()}")
    else:
        packed_environment(facts, say, limit_gb)  # now, so the first job does not wait for it
        say(f"the ranks of every job on a cluster will run in {facts.describe()}")
    SESSION.environment = choice
    return choice


def environment_status() -> str:
    """What ``%hvd_env`` says: what is shipped (its size and key), or that nothing is."""
    choice = SESSION.environment
    if choice is None:
        return ("The notebook's environment is not shipped: the ranks run in the executors' own "
                "Python. %hvd_env ship (hvd_magics.ship_environment()) ships it.")
    facts = environment_facts(choice.prefix, measure=True)
    changed = (f"; changed since the last job shipped {choice.shipped.key}: the next job ships "
               "it again" if choice.shipped is not None and choice.shipped.key != facts.key else "")
    return f"Shipped to the executors of a cluster: {facts.describe()}{changed}."
