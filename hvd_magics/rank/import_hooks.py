"""Patch a module right after it is imported, whenever the user's code imports it.

Used by the Keras progress callback (:mod:`hvd_magics.rank.keras_progress`) and the engine
guard (:mod:`hvd_magics.rank.engine_guard`).
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable, Iterable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Find ``names`` with the other finders and run ``patch(module)`` once each has loaded."""

    def __init__(self, names: Iterable[str], patch: Callable[[Any], None]) -> None:
        self.names = frozenset(names)
        self.patch = patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _AfterImport) and fullname in finder.names \
                    or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                original_exec = spec.loader.exec_module

                def exec_module(module: Any, _exec: Any = original_exec) -> None:
                    _exec(module)
                    self.patch(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def after_import(names: Iterable[str], patch: Callable[[Any], None]) -> None:
    """Call ``patch(module)`` for each of ``names`` already imported, and for the others as
    soon as they are imported."""
    names = tuple(names)
    for name in names:
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport(names, patch))
