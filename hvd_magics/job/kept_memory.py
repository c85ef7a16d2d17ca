"""A job's steps kept in the hosts' memory (``checkpoint.keep``), as its controller uses them: the
job's key and secret among the keepers, which step the next attempt resumes from (memory or a
file: the newer), and dropping them once the job succeeded.

The kept steps of a job outlive its run in the notebook's session (:data:`SESSION`): running
the same job again (its checkpoint folder) resumes from them, as a restart does, until a keeper
removes them after ``HVD_MAGICS_KEEP_IDLE_S`` untouched (600 s).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hvd_magics.common.step_keeper_wire import digest, drop, new_secret
from hvd_magics.common.kept_steps import keep_root, remove_job
from hvd_magics.job.readings.kept_steps import KeptSteps
from hvd_magics.job.session import SESSION
from hvd_magics.protocol import (ENV_KEEP_IDLE_S, ENV_KEEP_JOB, ENV_KEEP_PARTS, ENV_KEEP_PEERS,
                                 ENV_KEEP_SECRET, ENV_RESUME_FROM)
from hvd_magics.rank.step_keeper import IDLE_S


@dataclass
class KeptJob:
    """One job's kept steps: its key and secret among the keepers, and what the hosts said."""

    key: str
    secret: str
    steps: KeptSteps = field(default_factory=KeptSteps)

    def rank_env(self, step: int | None) -> dict[str, str]:
        """What the ranks are told: the job's key and secret, and, when the attempt resumes
        from memory (``step``), that it does and the keepers that hold it."""
        env = {ENV_KEEP_JOB: self.key, ENV_KEEP_SECRET: self.secret, ENV_RESUME_FROM: "file"}
        if step is not None:
            env.update({ENV_RESUME_FROM: "memory", ENV_KEEP_PEERS: self.steps.peers(step),
                        ENV_KEEP_PARTS: str(self.steps.parts)})
        return env


def kept_job(folder: Path) -> KeptJob:
    """The kept steps of the job whose checkpoint folder is ``folder``, in this session."""
    found = SESSION.kept.get(str(folder))
    if found is None:
        secret = new_secret()
        found = SESSION.kept[str(folder)] = KeptJob(digest(secret + str(folder))[:16], secret)
    return found


def memory_step(kept: KeptJob, file_step: int | None) -> int | None:
    """The step the next attempt resumes from memory: the newest every host holds, when it is
    at least the newest file's; else ``None`` (a file, or nothing)."""
    step = kept.steps.resume_step()
    if step is None or (file_step is not None and step < file_step):
        return None
    return step


def drop_kept(folder: Path, env: Mapping[str, str]) -> None:
    """Remove the job's kept steps from every host (the job succeeded, or starts fresh);
    ``env``: the ranks' environment (which may name the hosts' folder of kept steps)."""
    kept = SESSION.kept.pop(str(folder), None)
    if kept is None:
        return
    for address in kept.steps.keepers():  # a lost host's keeper is not waited for
        threading.Thread(target=drop, args=(address, kept.key, kept.secret), daemon=True,
                         name="hvd-magics-drop-kept").start()
    remove_job(keep_root({**os.environ, **env}), kept.key)  # this machine's, keeper or not


def resumed_from_memory(kept: KeptJob, step: int) -> str:
    """Where an attempt resumes, in words, when it is memory."""
    hosts = [name for name, host in kept.steps.hosts.items() if step in host.steps]
    newest = kept.steps.newest()
    redo = f"; the newest kept was step {newest:,}" if newest is not None and newest > step \
        else ""
    return (f"resumes from step {step:,} kept in the memory of {len(hosts)} "
            f"host{'s' if len(hosts) != 1 else ''}{redo}")


def idle_words(env: Mapping[str, str]) -> str:
    """How long a keeper keeps a failed job's steps, in words (``HVD_MAGICS_KEEP_IDLE_S`` of
    the ranks' environment, else 600 s)."""
    try:
        seconds = float(env.get(ENV_KEEP_IDLE_S) or os.environ.get(ENV_KEEP_IDLE_S) or IDLE_S)
    except ValueError:
        seconds = IDLE_S
    return (f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} s") + \
        " (HVD_MAGICS_KEEP_IDLE_S)"
