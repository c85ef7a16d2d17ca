"""PyTorch's C++ extensions built when first used (``torch.utils.cpp_extension.load``: DeepSpeed's
ops, its CPU communication op on the first ``deepspeed.initialize``): a build killed half-way
no longer blocks every later one for ever.

Every process that loads such an extension takes a lock file in its build folder
(``~/.cache/torch_extensions/.../lock``, ``torch.utils.file_baton.FileBaton``) and removes it when
its build ends; the others wait while the file exists, with no end and no word. A rank killed
while it holds it (a job stopped, interrupted or failed elsewhere: its group is killed) leaves
the file, and every later job that loads the extension on that host waits for ever. The holder
keeps the file open for as long as it builds, so a lock that no process holds open was left by
one that died: it is taken away (and said, once), when the lock was made on this host.

A first build says so in one line (it takes half a minute to minutes, in which the rank says
nothing): which extension, and where it is kept for later jobs.

Patched on import of ``torch.utils.file_baton`` and ``torch.utils.cpp_extension``; nothing is
imported here.
"""
from __future__ import annotations

import inspect
import os
import socket
import sys
import time
from typing import Any

from hvd_magics.protocol import FIRST_BUILD
from hvd_magics.rank.guards.import_hooks import after_import, before_call

#: The mark of this module's patches.
MARK = "_hvd_magics_stale_lock"

#: What a lock file this module wrote says of its holder (its host, then its pid).
_OWNER_PREFIX = "hvd_magics lock of"
_OWNER = _OWNER_PREFIX + " {host} pid {pid}\n"

#: File systems one host's processes cannot see all the users of: a lock there may be held on
#: another host (a home folder shared over the network), so one with no owner is left alone.
_SHARED_FILE_SYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "fuse", "beegfs",
                        "glusterfs", "ceph", "9p", "afs", "panfs", "wekafs")

#: Seconds between two looks at a lock being waited for.
WAIT_STEP_S = 0.1
#: Seconds between two checks of whether a lock being waited for is still held.
CHECK_EVERY_S = 2.0


def install() -> None:
    """Patch ``FileBaton`` and the extensions' builds whenever torch imports them."""
    after_import(["torch.utils.file_baton"], _patch)
    after_import(["torch.utils.cpp_extension"], _patch_builds)


def _patch_builds(module: Any) -> None:
    """Make ``cpp_extension._jit_compile`` (what ``load`` and ``load_inline`` call) say a first
    build (:func:`say_first_build`)."""
    original = getattr(module, "_jit_compile", None)
    if original is None:
        return
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        return
    suffix = getattr(module, "LIB_EXT", ".so")

    def first(*args: Any, **kwargs: Any) -> None:
        try:
            named = signature.bind_partial(*args, **kwargs).arguments
            say_first_build(str(named["name"]), str(named["build_directory"]), suffix)
        except (TypeError, KeyError):
            pass  # a torch whose builds take other arguments: nothing said

    before_call(module, "_jit_compile", first, MARK)


def say_first_build(name: str, folder: str, suffix: str = ".so") -> bool:
    """Say, on the rank's output, that the extension ``name`` is built now when ``folder`` holds
    no build of it; whether it was said."""
    if os.path.exists(os.path.join(folder, name + suffix)):
        return False
    print(f"{FIRST_BUILD} {name}, its first use on this host (half "
          f"a minute to minutes, without a word; kept in {folder} for later jobs)",
          file=sys.stderr, flush=True)
    return True


def _patch(module: Any) -> None:
    baton = module.FileBaton
    if getattr(baton.try_acquire, MARK, False):
        return
    original_acquire = baton.try_acquire

    def try_acquire(self: Any) -> bool | None:
        taken = original_acquire(self)
        if not taken and remove(self.lock_file_path, stale_lock_id(self.lock_file_path)):
            taken = original_acquire(self)
        if taken:
            _write_owner(self.lock_file_path)
        return taken

    def wait(self: Any) -> None:
        checked = time.monotonic()
        while os.path.exists(self.lock_file_path):
            time.sleep(getattr(self, "wait_seconds", WAIT_STEP_S) or WAIT_STEP_S)
            if time.monotonic() - checked >= CHECK_EVERY_S:
                checked = time.monotonic()
                if remove(self.lock_file_path, stale_lock_id(self.lock_file_path)):
                    return  # its holder died: loading the extension says what is missing

    original_release = baton.release

    def release(self: Any) -> None:
        # the lock already gone is released: a rank's build failed with FileNotFoundError
        # here once, its peer having found the same stale lock at the same moment (suite,
        # stop 77; not reproduced): the extension was built, the job must not fail for it
        try:
            original_release(self)
        except FileNotFoundError:
            self.fd = None

    for name, patched in (("try_acquire", try_acquire), ("wait", wait), ("release", release)):
        setattr(patched, MARK, True)
        setattr(baton, name, patched)


def stale_lock_id(path: str) -> tuple[int, int, int] | None:
    """The lock file ``path`` (:func:`_file_id`) when a process that died left it: no process
    of this host holds it open, and it was made on this host (its holder wrote so, or, written
    by nobody, it lies on a file system of this host's only); ``None`` otherwise."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            said = file.read(200)
            seen = os.fstat(file.fileno())
    except OSError:
        return None
    if said.startswith(_OWNER_PREFIX):
        made_here = said.split()[3:4] == [socket.gethostname()]
    else:  # torch's own lock is empty: anything else is not a lock of torch's
        made_here = not said.strip() and not _on_shared_file_system(path)
    if not made_here or _held_open(seen):
        return None
    return _file_id(seen)


def _file_id(seen: os.stat_result) -> tuple[int, int, int]:
    """A file's device, inode and change time: a file made in place of a removed one often
    gets its inode number (two ranks found the same stale lock; one removed it and took the
    lock anew, and the other removed that, so both built, and one failed with
    ``FileNotFoundError`` on releasing it)."""
    return seen.st_dev, seen.st_ino, seen.st_ctime_ns


def remove(path: str, judged: tuple[int, int, int] | None) -> bool:
    """Remove the lock ``path`` found stale (``judged``: :func:`stale_lock_id`'s answer),
    unless it is another file by now, or held (a waiting process removed it first, and a live
    one took it again); say so on the rank's output; whether this process removed it."""
    try:
        now = os.stat(path)
        if judged is None or _file_id(now) != judged or _held_open(now):
            return False
        os.remove(path)
    except OSError:
        return False
    print(f"hvd_magics: removed {path}, a lock left by a build of this PyTorch extension that "
          "was killed half-way (no process holds it): building it again", file=sys.stderr,
          flush=True)
    return True


def _write_owner(path: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(_OWNER.format(host=socket.gethostname(), pid=os.getpid()))
    except OSError:
        pass


def _held_open(target: os.stat_result) -> bool:
    """Whether a process of this host, other than this one, has the file ``target`` open (a
    lock of another user's counts as held: not all of their processes can be seen)."""
    if target.st_uid != os.getuid():
        return True  # another user's lock: their processes are not all ours to see
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        folder = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(folder)
        except OSError:
            continue  # ended meanwhile, or another user's (who cannot open this user's lock)
        for fd in fds:
            try:
                seen = os.stat(f"{folder}/{fd}")
            except OSError:
                continue
            if (seen.st_dev, seen.st_ino) == (target.st_dev, target.st_ino):
                return True
    return False


def _on_shared_file_system(path: str) -> bool:
    """Whether ``path`` lies on a network file system (``/proc/mounts``; unknown: shared)."""
    real = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) > len(best):
                    best, kind = point, fields[2]
    except OSError:
        return True
    return not best or kind.split(".")[0] in _SHARED_FILE_SYSTEMS
