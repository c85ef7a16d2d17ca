"""A rank's private temporary folder, and tidying it when the rank ends.

A rank ends with ``os._exit`` (frameworks' exit hooks can block when a peer is gone), so files
that frameworks delete only at exit -- TensorFlow's ``__autograph_generated_file*.py``, about
fifteen per Keras rank -- piled up in the executor's ``/tmp`` job after job. The supervisor makes
each rank a private ``TMPDIR``; when the rank ends or is killed, the supervisor (or, when the
supervisor itself is gone, the rank's keeper) removes those leftovers and the empty folders, the
private folder too when nothing else is left. Files the user's code left there stay.
"""
from __future__ import annotations

import os
import tempfile

#: Prefix of the private temporary folder of each rank process.
RANK_TMP_PREFIX = "hvd_magics-rank-"
#: Files frameworks leave in the temporary folder and delete only in exit hooks the rank skips.
EXIT_HOOK_LEFTOVERS = ("__autograph_generated_file",)


def make_rank_tmpdir() -> str | None:
    """A private temporary folder for the rank (``None`` when none can be made: the rank then
    uses the usual one)."""
    try:
        return tempfile.mkdtemp(prefix=RANK_TMP_PREFIX)
    except OSError:
        return None


def use_tmpdir(folder: str) -> None:
    """Make ``folder`` this process's (and its children's) temporary folder.

    Caches that frameworks keep in the temporary folder stay shared between jobs: PyTorch's
    inductor cache keeps its usual place unless ``TORCHINDUCTOR_CACHE_DIR`` is set.
    """
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        try:
            import getpass
            import re

            user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                                 f"torchinductor_{user}")
        except (KeyError, OSError):  # no user name: torch finds none either
            pass
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder


def clean_rank_tmpdir(folder: str | None) -> None:
    """Remove the frameworks' exit-hook leftovers and empty folders from ``folder`` (``folder``
    too when it is left empty); files the user's code left stay, with the folders holding them."""
    if not folder:
        return
    for place, subfolders, names in os.walk(folder, topdown=False):
        for name in names:
            if name.startswith(EXIT_HOOK_LEFTOVERS):
                try:
                    os.remove(os.path.join(place, name))
                except OSError:
                    pass
        for name in subfolders:
            path = os.path.join(place, name)
            if not os.path.islink(path):
                try:
                    os.rmdir(path)  # only when empty
                except OSError:
                    pass
    try:
        os.rmdir(folder)
    except OSError:
        pass
