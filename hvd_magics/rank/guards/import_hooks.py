"""Patch a module right after it is imported, whenever the user's code imports it.

Used by the libraries' integrations (:mod:`hvd_magics.rank.integrations`: progress, guards)
and the engines' guards (:mod:`hvd_magics.rank.guards.engine_guard`, ...). Several may patch one
module: each patch runs, in the order they were asked for. :func:`after_call` and
:func:`before_call` hook one method; :func:`refusing` makes a guard's check of a message
function.
"""
from __future__ import annotations

import functools
import importlib.abc
import sys
from typing import Any
from collections.abc import Callable, Iterable

#: Per module name, the patches to run once it has loaded.
_PATCHES: dict[str, list[Callable[[Any], None]]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Find the modules of :data:`_PATCHES` with the other finders and run their patches once
    each has loaded."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _AfterImport) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                original_exec = spec.loader.exec_module

                def exec_module(module: Any, _exec: Any = original_exec,
                                _name: str = fullname) -> None:
                    _exec(module)
                    if module.__name__ != _name:
                        return  # another module of a loader that loads many (a zip's)
                    for patch in list(_PATCHES.get(_name, ())):
                        patch(module)

                # the loader's own method, wrapped; one loader may load many modules (a
                # zipimporter loads every module of its zip: the package shipped to executors)
                spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # wrapped
                return spec
        return None


_FINDER = _AfterImport()


def after_import(names: Iterable[str], patch: Callable[[Any], None]) -> None:
    """Call ``patch(module)`` for each of ``names`` already imported, and for the others as
    soon as they are imported."""
    for name in names:
        _PATCHES.setdefault(name, []).append(patch)
        if name in sys.modules:
            patch(sys.modules[name])
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def after_call(owner: Any, name: str, then: Callable[[Any], None], mark: str) -> None:
    """Make the method ``owner.name`` call ``then(self)`` once it has run, unless a patch marked
    ``mark`` already did (an ``__init__`` that adds a callback, or checks what was made)."""
    original = getattr(owner, name)
    if getattr(original, mark, False):
        return

    @functools.wraps(original)
    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        then(self)
        return result

    setattr(patched, mark, True)
    setattr(owner, name, patched)


def before_call(owner: Any, name: str, first: Callable[..., None], mark: str) -> None:
    """Make the method (or module function) ``owner.name`` call ``first`` with its arguments
    (``self`` first, for a method) before it runs (``first`` may raise to refuse the call),
    unless a patch marked ``mark`` already did."""
    original = getattr(owner, name)
    if getattr(original, mark, False):
        return

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        first(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(patched, mark, True)
    setattr(owner, name, patched)


def with_kwargs(owner: Any, name: str, adjust: Callable[..., dict[str, Any]], mark: str) -> None:
    """Make the method ``owner.name`` run with the keyword arguments
    ``adjust(self, args, kwargs)`` returns (a default filled in), unless a patch marked
    ``mark`` already did."""
    original = getattr(owner, name)
    if getattr(original, mark, False):
        return

    @functools.wraps(original)
    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **adjust(self, args, kwargs))

    setattr(patched, mark, True)
    setattr(owner, name, patched)


def refusing(message: Callable[..., str | None], error: type[Exception]) -> Callable[..., None]:
    """A check that raises ``error(text)`` when ``message(...)`` gives a text (a refusal), and
    lets the call go on when it gives ``None``."""
    def check(*args: Any, **kwargs: Any) -> None:
        text = message(*args, **kwargs)
        if text is not None:
            raise error(text)

    return check
