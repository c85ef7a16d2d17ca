"""What a supervisor says of a rank forked from a zygote whose keeper did not say its exit code."""
import io
import socket

import pytest

from hvd_magics.task.zygotes import ZygoteRank


def _ended(said: bytes) -> ZygoteRank:
    ours, keeper = socket.socketpair()
    keeper.sendall(said)
    keeper.close()
    rank = ZygoteRank(4242, io.BytesIO(), io.BytesIO(), ours, b"pid 4242\n")
    rank.wait(10)
    return rank


@pytest.mark.parametrize("said, code, how", [
    (b"exit 3\n", 3, ""),
    (b"exit -9\n", -9, ""),  # the rank itself was killed: its keeper saw it
    (b"stopped parent-gone\n", -9, "which was stopped because the host's zygote that forked it"),
    (b"stopped sigterm\n", -9, "which something on the host stopped (SIGTERM)"),
    (b"", -9, "which was killed without a word (SIGKILL, or the host ran out of memory)"),
])
def test_the_keepers_word_or_its_silence_is_what_is_said(said, code, how):
    rank = _ended(said)
    assert rank.returncode == code
    assert (how in rank.how and "pid 4242" in rank.how) if how else rank.how == "", rank.how
