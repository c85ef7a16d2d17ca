"""What to do about a job's first failure, when its text says what kind it is: a table of the
failures users meet most, each with the markers that recognise it and the fix to append."""
from __future__ import annotations

from dataclasses import dataclass

from hvd_magics.errors import HOROVOD_BUILD_COMMAND, RankFailure
from hvd_magics.protocol import ENV_GLOO_TIMEOUT


@dataclass(frozen=True)
class FailureHint:
    """A kind of failure: any of ``markers`` in a rank's message or traceback, and its fix."""

    markers: tuple[str, ...]
    hint: str

    def matches(self, failure: RankFailure) -> bool:
        text = f"{failure.message} {failure.traceback}"
        return any(marker in text for marker in self.markers)


#: A rank picking a GPU it cannot see, or NCCL finding two ranks on one GPU (seen on an H200
#: with np=-2: docs/gpu-nodes.md).
GPU_SHARING = FailureHint(
    ("invalid device ordinal", "Duplicate GPU detected"),
    "\nA host with fewer GPUs than ranks shares them: each rank then sees only the GPU it "
    "shares (as cuda:0), so torch.cuda.set_device(LOCAL_RANK) names a device it cannot see, "
    "and NCCL refuses two ranks on one GPU. Fix: at most one rank per GPU (np=-1 on a driver "
    "with one GPU; on Spark, as many task GPUs as ranks), or the gloo backend where ranks must "
    "share a GPU.")

#: The ranks' Python lacks Horovod (PyPI's does not build against today's frameworks).
HOROVOD_MISSING = FailureHint(
    ("No module named 'horovod'",),
    "\nHorovod is not installed in the ranks' Python. Fix: install what its build needs and "
    f"build it for that environment: `pip install \"hvd_magics[horovod]\"`, then "
    f"`{HOROVOD_BUILD_COMMAND}` (in a notebook: `%pip install \"hvd_magics[horovod]\"`, then "
    "`!{sys.executable} -m hvd_magics.horovod build`, then restart the kernel; on a cluster, "
    "in the executors' Python too, or send the "
    "notebook's environment with %hvd_env ship), or run the job with --engine torch "
    "(PyTorch DDP, no Horovod needed).")

#: A rank's Gloo rendezvous in ``hvd.init()`` timed out (``Wait timeout after 30 seconds for
#: key(s): 0``): the rank that failed waited; the rank it waited for was late or gone.
GLOO_START_TIMEOUT = FailureHint(
    (f"You may want to increase the timeout via {ENV_GLOO_TIMEOUT}",),
    "\nHorovod's start timed out: this rank waited in hvd.init() for a peer that never gave "
    "its address (Gloo's key is that peer's rank in the group being formed), for "
    f"{ENV_GLOO_TIMEOUT} (30 s unless set). The rank that failed is the one that "
    "waited; the late one is among the others (see their output). Ranks reach hvd.init() late "
    "when slow work comes before it on some of them (data loading, a download), a host is "
    "overloaded, or one failed first. Fix: call hvd.init() first, or give the ranks longer: "
    f"--env {ENV_GLOO_TIMEOUT}=120 (env={{'{ENV_GLOO_TIMEOUT}': '120'}}).")

HINTS = (GPU_SHARING, HOROVOD_MISSING, GLOO_START_TIMEOUT)


def hint_for(failure: RankFailure) -> str:
    """The fix for ``failure``'s kind (starting with a newline), or ``""``."""
    return next((hint.hint for hint in HINTS if hint.matches(failure)), "")
