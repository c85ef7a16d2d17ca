"""Where a host's zygotes serve: a folder of the user's own, a socket path per key, a lock.

The folder (``HVD_MAGICS_ZYGOTE_DIR``, by default ``hvd-magics-zygotes-<uid>`` in the temporary
folder, or in ``/tmp`` when that one's path is too long for a socket's) must be a real folder
owned by the user and closed to everyone else: a zygote forks processes for whoever may connect
to it. A folder that is not (another user made it first, or
its mode was opened) is not used, and ranks start fresh. The lock beside a socket path is held
by the process that starts or grows the zygote serving there until it serves, so that two
processes needing one at once start one, and so that a process that finds no zygote serving
can tell one is on its way (:func:`starting`).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import tempfile

from hvd_magics.protocol import ENV_ZYGOTE_DIR

#: The longest path of a Unix socket (108 bytes with the final NUL on Linux).
MOST_SOCKET_PATH = 100


def zygote_dir(env: dict[str, str]) -> str | None:
    """The folder of this user's zygote sockets (made when missing), or ``None`` when it is not
    safe to use."""
    folder = env.get(ENV_ZYGOTE_DIR) or os.environ.get(ENV_ZYGOTE_DIR)
    if not folder:
        name = f"hvd-magics-zygotes-{os.getuid()}"
        folder = os.path.join(tempfile.gettempdir(), name)
        if len(folder) > MOST_SOCKET_PATH // 2 and os.path.isdir("/tmp"):
            folder = os.path.join("/tmp", name)  # a container's long temporary folder (YARN)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        found = os.lstat(folder)
    except OSError:
        return None
    if (not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid()
            or found.st_mode & 0o077):
        return None
    return folder


def socket_path(folder: str, key: object) -> str | None:
    """The socket of the zygote for ``key`` (any value with a stable ``repr``) in ``folder``, or
    ``None`` when the folder's path is too long for a socket."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    path = os.path.join(folder, f"{digest}.sock")
    return path if len(path.encode()) + 8 <= MOST_SOCKET_PATH else None  # + ".<pid>" while bound


def take_lock(path: str) -> int | None:
    """The file descriptor of the lock of the zygote at ``path``, taken (``None``: another
    process holds it, starting or growing that zygote). Closing every copy releases it."""
    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def starting(path: str) -> bool:
    """Whether a process holds the lock of the zygote at ``path``: one is being started (or
    grown) there. (A shared lock taken for a moment: a process taking the lock just then finds
    it held and leaves the start to the next job, as when two processes start one at once.)"""
    try:
        fd = os.open(f"{path}.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def starter_cpu(path: str) -> float | None:
    """The CPU seconds so far of the zygote being started at ``path`` (its imports under way),
    whose id its lock's file holds while it imports; ``None`` when none is named there, it is
    gone, or this system has no ``/proc``. Read by hand, not through psutil: a Spark task that
    waits may run on an executor whose Python has only pyspark and pyarrow."""
    try:
        with open(f"{path}.lock") as lock:
            pid = int(lock.read().strip() or 0)
        if pid <= 0:
            return None
        with open(f"/proc/{pid}/stat") as stat_file:
            after_name = stat_file.read().rsplit(")", 1)[1].split()
        return (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cuda_mark(path: str) -> str:
    """The file beside the socket path ``path`` that says a zygote started there found a CUDA
    driver loaded by its imports: none is started there again (nor waited for)."""
    return f"{path}.cuda"
