"""Leaving the engine together through its key-value store (a dict stands in for the store:
TensorFlow's coordination service and torch's store are used by the driver tiers)."""
import pytest

from hvd_magics.rank import leave_together


class _Store:
    """A store whose holder ends once every peer is gone: a peer's last set may then fail
    (its answer lost with the holder)."""

    def __init__(self, fail_on: str = "") -> None:
        self.keys: set[str] = set()
        self.fail_on = fail_on

    def set(self, key: str) -> None:
        self.keys.add(key)
        if key == self.fail_on:
            raise RuntimeError("Socket closed (InsertKeyValue)")

    def wait(self, keys: list[str], seconds: float | None) -> None:  # noqa: ARG002
        missing = set(keys) - self.keys
        assert not missing, f"would wait for ever for {missing}"


def test_a_peer_whose_last_answer_was_lost_with_the_holder_leaves_without_an_error():
    store = _Store(fail_on=f"{leave_together._GONE_KEY}1")
    store.keys.add(f"{leave_together._LEFT_KEY}0")
    leave_together._leave_through(store.set, store.wait, 1, [0, 1], 0)
    assert f"{leave_together._GONE_KEY}1" in store.keys


def test_a_failure_before_every_peer_has_left_is_still_raised():
    store = _Store(fail_on=f"{leave_together._LEFT_KEY}1")
    with pytest.raises(RuntimeError, match="Socket closed"):
        leave_together._leave_through(store.set, store.wait, 1, [0, 1], 0)


def test_the_holder_waits_until_every_peer_is_gone():
    store = _Store()
    store.keys |= {f"{leave_together._LEFT_KEY}1", f"{leave_together._GONE_KEY}1"}
    leave_together._leave_through(store.set, store.wait, 0, [0, 1], 0)
    store.keys.discard(f"{leave_together._GONE_KEY}1")
    with pytest.raises(AssertionError, match="gone/1"):
        leave_together._leave_through(store.set, store.wait, 0, [0, 1], 0)
