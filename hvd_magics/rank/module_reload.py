"""A warm pool's ranks reload the user's own modules whose files changed, as IPython's autoreload
does (on a rank of a warm pool, between cells).

A pool's rank imports a module once and keeps it, so a module from the user's folder that was
edited (and reloaded in the notebook) would run its old code on the pool while cold ranks run the
new. Before each cell the rank reloads, with :func:`importlib.reload`, every module it imported
from outside the Python installation (not the standard library, not site-packages, not
hvd_magics) whose file's size or modification time changed since the rank first saw it.
Module-level state of those modules starts again; objects made from the old classes keep them.
"""
from __future__ import annotations

import importlib
import os
import site
import sys
import sysconfig
from typing import Any

#: Folders whose modules are the installation's, never reloaded.
_INSTALLED = tuple(os.path.realpath(p) + os.sep for p in {
    sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(),
    site.getusersitepackages(), *sysconfig.get_paths().values()} if p)


def _user_file(module: Any) -> str | None:
    """The source file of ``module`` when it is one of the user's own, else ``None``."""
    name = getattr(module, "__name__", "") or ""
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or name == "__main__" or \
            name.split(".")[0] == "hvd_magics":
        return None
    real = os.path.realpath(path)
    return None if real.startswith(_INSTALLED) else real


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


class ModuleWatch:
    """The user's modules a rank imported, each with its file's stamp when first seen."""

    def __init__(self) -> None:
        self.stamps: dict[str, tuple[str, tuple[int, int] | None]] = {}
        #: Every module name looked at, the installation's too: each is looked at once.
        self.seen: set[str] = set()

    def remember(self) -> None:
        """Note the user's modules imported since the last call (after a cell ran).

        Only modules not looked at before: a rank that imported torch holds about 1,500, and
        resolving every one's path again after each cell cost a warm pool 40 ms a cell.
        """
        for name, module in list(sys.modules.items()):
            if name in self.seen:
                continue
            self.seen.add(name)
            if (path := _user_file(module)) is not None:
                self.stamps[name] = (path, _stamp(path))

    def reload_changed(self) -> list[str]:
        """Reload every remembered module whose file changed (before a cell runs); their names.

        Raises
        ------
        Exception
            What the module's new code raised (a syntax error, say): the cell fails with it, as
            a cold rank's import would.
        """
        changed = [name for name, (path, stamp) in self.stamps.items()
                   if name in sys.modules and _stamp(path) != stamp]
        for name in sorted(changed, key=lambda n: n.count(".")):  # packages before their parts
            path = self.stamps[name][0]
            stamp = _stamp(path)
            importlib.reload(sys.modules[name])  # tried again next cell when it raises
            self.stamps[name] = (path, stamp)
        return changed
