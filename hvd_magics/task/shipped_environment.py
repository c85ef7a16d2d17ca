"""On an executor: the interpreter of the notebook's shipped environment, which Spark unpacked
for the task (see :mod:`hvd_magics.launch.environment_shipping`), checked before the rank starts
with it."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys

from hvd_magics.protocol import ENV_RANK_PYTHON, ENV_SHIPPED_ENVIRONMENT, ENV_SHIPPED_PYTHON

#: How long the shipped interpreter may take to say its version.
PROBE_S = 60.0


class ShippedEnvironmentUnusable(RuntimeError):
    """The shipped environment cannot run on this executor; the message says why and the fix."""


def _unpacked(alias: str) -> str | None:
    """Where Spark unpacked the archive ``alias`` for this task, or ``None``."""
    folders = [os.path.join(os.getcwd(), alias)]  # a Spark Connect session's artifacts
    try:
        from pyspark import SparkFiles

        folders.insert(0, os.path.join(SparkFiles.getRootDirectory(), alias))
    except Exception:  # noqa: BLE001,S110 - no Spark files here: only the working folder
        pass
    return next((folder for folder in folders if os.path.isdir(folder)), None)


def rank_python(job_env: dict[str, str]) -> dict[str, str]:
    """``{ENV_RANK_PYTHON: interpreter}`` when the job ships an environment, else ``{}``.

    Raises
    ------
    ShippedEnvironmentUnusable
        The archive is not here, or its interpreter does not run here, or runs another Python.
    """
    alias = job_env.get(ENV_SHIPPED_ENVIRONMENT)
    if not alias:
        return {}
    wanted = job_env.get(ENV_SHIPPED_PYTHON, "")
    where = f"the executor on {socket.gethostname()} ({platform.system()}-{platform.machine()})"
    folder = _unpacked(alias)
    if folder is None:
        raise ShippedEnvironmentUnusable(
            f"{where} has no unpacked copy of the shipped environment {alias}. Fix: run the job "
            "again (Spark sends it with the next job), or hvd_magics.ship_environment(False)")
    python = os.path.join(folder, "bin", "python")
    try:
        said = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=PROBE_S)
        version = said.stdout.strip() if said.returncode == 0 else None
        why = said.stderr.strip().splitlines()[-1:] if said.returncode else []
    except OSError as exc:  # the venv's bin/python links to an interpreter this host lacks
        version, why = None, [f"{type(exc).__name__}: {exc.strerror or exc}"]
    if version is None:
        target = os.path.realpath(python)
        raise ShippedEnvironmentUnusable(
            f"the shipped environment's Python does not run on {where}: {python} -> {target} "
            f"({'; '.join(why) or 'no output'}). A venv does not carry its interpreter: the "
            f"executors need Python {wanted} at {target}. Fix: give the executors that Python, "
            "or run the notebook in a conda environment (conda-pack carries the interpreter) and "
            "ship that")
    if wanted and version != wanted:
        raise ShippedEnvironmentUnusable(
            f"the shipped environment was packed for Python {wanted}, but its interpreter on "
            f"{where} is Python {version} (this executor's own is "
            f"{sys.version_info[0]}.{sys.version_info[1]}). Fix: the same Python on the "
            "executors, or a conda environment (conda-pack carries the interpreter)")
    return {ENV_RANK_PYTHON: python}
