"""Killing a rank's process group only while its number is still the rank's."""
import subprocess
import sys

from hvd_magics.common.process_group import killpg, start_time


def _group_leader() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)


def test_a_group_led_by_a_process_of_another_start_time_is_not_killed():
    """The supervisor killed a rank's group after the rank had ended, by its number: once
    Linux gave that number to another job's rank or keeper (each leads a group), it died."""
    other = _group_leader()
    try:
        started = start_time(other.pid)
        assert started is not None
        killpg(other.pid, started - 1)  # the number's former holder started earlier
        assert other.poll() is None and start_time(other.pid) == started
        killpg(other.pid, started)
        assert other.wait(timeout=10) == -9
    finally:
        other.kill()
        other.wait()


def test_a_group_whose_leader_ended_is_killed_without_a_start_time():
    leader = _group_leader()
    leader.kill()
    leader.wait()
    assert start_time(leader.pid) is None
    killpg(leader.pid, 12345)  # nobody holds the number: nothing to do, and no error
    killpg(None)
