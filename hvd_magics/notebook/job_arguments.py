"""The arguments of ``%%horovod`` and ``%hvd_pool start`` that are a job's options, made from
their declaration (:data:`hvd_magics.option_table.OPTIONS`: flags, default, help, how the value
is read) and shared by both magics, as ipyparallel's ``%px``, ``%%px`` and ``%pxconfig`` share
theirs. Each is parsed under its keyword's name (``--verbosity`` as ``driver_log_verbosity``),
and goes to :class:`hvd_magics.HorovodRunner` or :class:`hvd_magics.HorovodPool` as it is."""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

from hvd_magics.notebook.magic_line import option
from hvd_magics.option_table import (MAYBE_TEXT, NUMBER, POOL_OPTIONS, RUNNER_OPTIONS, SWITCH,
                                     TEXT, TEXTS, Option)
from hvd_magics.options import from_text

#: How a magic reads each kind of value (:func:`hvd_magics.notebook.magic_line.option`'s words).
_READS: dict[str, dict[str, Any]] = {
    NUMBER: {"type": from_text}, TEXT: {}, SWITCH: {"flag": True}, TEXTS: {"many": True},
    MAYBE_TEXT: {"nargs": "?", "const": True}}
#: The options each magic reads itself: ``np`` (it decides the warm pool) and ``env`` (its
#: ``NAME=VALUE`` words).
_READ_BY_THE_MAGIC = ("np", "env")


def _options(pool: bool) -> tuple[Option, ...]:
    return tuple(o for o in (POOL_OPTIONS if pool else RUNNER_OPTIONS) if o.flags)


def job_arguments(pool: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The declared options with flags as a magic's arguments, in their declared order:
    ``%%horovod``'s (``HorovodRunner``'s keywords), or with ``pool`` ``%hvd_pool``'s
    (``HorovodPool``'s, each help beginning ``start:``)."""
    decorators = [option(*o.flags, dest=o.name, default=o.unset, metavar=o.metavar,
                         help=o.pool_magic_help if pool else o.help, **_READS[o.reads])
                  for o in _options(pool)]

    def apply(magic: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            magic = decorator(magic)
        return magic

    return apply


def job_keywords(args: Any, pool: bool = False) -> dict[str, Any]:
    """The parsed options that go to the runner (or with ``pool`` to the pool) as they are,
    by keyword: all but ``np`` and ``env``, which the magic reads itself."""
    return {o.name: getattr(args, o.name) for o in _options(pool)
            if o.name not in _READ_BY_THE_MAGIC}
