"""A pool's notebook values: a pickle sent once, then its digest; each cell gets a fresh object."""
import pytest

from hvd_magics.launch.payload import sent_value
from hvd_magics.common import kept_values
from hvd_magics.common.kept_values import SentValue, unpack_values


def test_a_value_sent_once_comes_back_by_digest_as_a_fresh_object(monkeypatch):
    monkeypatch.setattr(kept_values, "_KEPT", {})
    sent = sent_value([1, 2, 3])
    first = unpack_values({"x": sent, "plain": 7})
    first["x"].append(4)
    again = unpack_values({"x": SentValue(sent.digest)})
    assert first["plain"] == 7 and again["x"] == [1, 2, 3]
    assert sent_value([1, 2, 3]).digest == sent.digest != sent_value([1, 2]).digest


def test_a_digest_the_rank_does_not_hold_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(kept_values, "_KEPT", {})
    unpack_values({"x": sent_value(1)})
    with pytest.raises(RuntimeError, match="does not hold the notebook value 'x'.*run the cell"):
        unpack_values({"x": SentValue(sent_value(2).digest)})


def test_what_cannot_be_pickled_is_left_to_the_payloads_own_error():
    import threading

    assert sent_value(threading.Lock()) is None
