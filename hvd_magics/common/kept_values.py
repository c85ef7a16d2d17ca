"""Notebook values a warm pool's ranks keep, so that a cell sends again only what changed.

On a pool the notebook values a cell reads travel as :class:`SentValue`: the digest of the value's
pickle, with the pickle itself only when the ranks do not hold that digest under that name yet
(the driver side is :meth:`hvd_magics.job.pool.HorovodPool.pack_values`). A rank keeps the
pickle, not the object, and unpickles it for every cell: a cell that changed the object on the
rank does not change what the next cell gets, as when every cell received its values anew.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SentValue:
    """A notebook value as it reaches a pool's rank.

    Attributes
    ----------
    digest : str
        The digest of the value's pickle.
    pickled : bytes or None
        The pickle; ``None`` when the rank holds it from an earlier cell.
    """

    digest: str
    pickled: bytes | None = None


#: name -> (digest, pickle) of the values this rank holds.
_KEPT: dict[str, tuple[str, bytes]] = {}


def unpack_values(values: dict[str, Any]) -> dict[str, Any]:
    """The cell's values as objects (a :class:`SentValue` from its pickle, kept for later cells).

    Raises
    ------
    RuntimeError
        When a value sent by digest only is not the one this rank holds (the driver sends again
        after a failed cell, so this means the rank and the driver disagree).
    """
    objects = {}
    for name, value in values.items():
        if isinstance(value, SentValue):
            if value.pickled is not None:
                _KEPT[name] = (value.digest, value.pickled)
            digest, pickled = _KEPT.get(name, ("", b""))
            if digest != value.digest:
                raise RuntimeError(f"this rank does not hold the notebook value {name!r} the "
                                   "driver sent earlier. Fix: run the cell again (every value "
                                   "is then sent again), or %hvd_pool restart.")
            value = pickle.loads(pickled)  # noqa: S301 - the notebook's own value
        objects[name] = value
    return objects
