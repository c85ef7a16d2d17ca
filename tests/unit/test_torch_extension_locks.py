"""The lock of a PyTorch extension's build (DeepSpeed's ops) that a killed build left: taken away
in a rank, where torch waited for it for ever; a lock still held, or not known to be this
host's, is left alone."""
import os
import subprocess
import sys
import threading

import pytest
import torch.utils.file_baton as torch_baton

from hvd_magics.rank.integrations import torch_extensions


@pytest.fixture(autouse=True)
def patched():
    baton = torch_baton.FileBaton
    before = (baton.try_acquire, baton.wait, baton.release)
    torch_extensions._patch(torch_baton)
    yield
    baton.try_acquire, baton.wait, baton.release = before


def _lock_of_a_killed_build(path):
    """Take the lock as torch does, in a process then killed (as a rank whose job was
    stopped halfway through its build)."""
    proc = subprocess.run([sys.executable, "-c", f"import os, signal; os.open({str(path)!r}, "
                           "os.O_CREAT | os.O_EXCL); os.kill(os.getpid(), signal.SIGKILL)"])
    assert proc.returncode == -9 and path.exists()


def test_a_lock_left_by_a_killed_build_is_taken_away_and_said(tmp_path, capsys):
    lock = tmp_path / "lock"
    _lock_of_a_killed_build(lock)
    baton = torch_baton.FileBaton(str(lock))
    assert baton.try_acquire() is True
    assert f"hvd_magics: removed {lock}, a lock left by a build of this PyTorch extension " \
           "that was killed half-way" in capsys.readouterr().err
    # the new holder says who it is, for the processes that wait for it
    assert lock.read_text() == f"hvd_magics lock of {os.uname().nodename} pid {os.getpid()}\n"
    baton.release()
    assert not lock.exists()


def test_a_waiter_ends_its_wait_once_the_holder_dies(tmp_path, monkeypatch):
    monkeypatch.setattr(torch_extensions, "CHECK_EVERY_S", 0.2)
    lock = tmp_path / "lock"
    holder = subprocess.Popen([sys.executable, "-c", f"import os, time; os.open({str(lock)!r}, "
                               "os.O_CREAT | os.O_EXCL); print(1, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"1\n"
        baton = torch_baton.FileBaton(str(lock))
        assert baton.try_acquire() is False  # held open by a live process: not taken
        waiter = threading.Thread(target=baton.wait, daemon=True)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and lock.exists()  # still held: it waits
        holder.kill()
        holder.wait()
        waiter.join(10)
        assert not waiter.is_alive() and not lock.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_stale_lock_another_rank_took_away_and_took_again_is_left_to_it(tmp_path):
    """Two ranks find the same stale lock; one removes it and takes the lock anew, and the new
    file often gets the old one's inode number: the other removed the live lock too, both
    built, and the one that released last failed with ``FileNotFoundError``."""
    lock = tmp_path / "lock"
    _lock_of_a_killed_build(lock)
    judged = torch_extensions.stale_lock_id(str(lock))
    assert judged is not None
    os.remove(lock)  # the first rank takes it away, and takes the lock as torch does
    holder = subprocess.Popen([sys.executable, "-c", f"import os, time; os.open({str(lock)!r}, "
                               "os.O_CREAT | os.O_EXCL); print(1, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"1\n"
        assert torch_extensions.remove(str(lock), judged) is False
        assert lock.exists()
        assert torch_extensions.stale_lock_id(str(lock)) is None  # held open: not stale
    finally:
        holder.kill()
        holder.wait()
    # once its holder died, it is stale in its turn
    assert torch_extensions.remove(str(lock), torch_extensions.stale_lock_id(str(lock)))
    assert not lock.exists()


def test_locks_not_known_to_be_this_hosts_are_left_alone(tmp_path):
    other_host = tmp_path / "other"
    other_host.write_text("hvd_magics lock of another-host pid 12\n")
    foreign = tmp_path / "foreign"
    foreign.write_text("not torch's\n")
    for lock in (other_host, foreign):
        assert torch_extensions.stale_lock_id(str(lock)) is None
        assert torch_baton.FileBaton(str(lock)).try_acquire() is False
        assert lock.exists()
    ours = tmp_path / "ours"
    ours.write_text(f"hvd_magics lock of {os.uname().nodename} pid 12\n")
    assert torch_extensions.stale_lock_id(str(ours)) is not None  # nobody holds it open


def test_a_first_build_is_said_with_where_it_is_kept(tmp_path, capsys):
    """A first build takes half a minute to minutes without a word (DeepSpeed's CPU op on the
    first ``deepspeed.initialize``): one line says what it is. Here through torch's own
    ``load``, of a source that does not compile (the build fails at once)."""
    from torch.utils import cpp_extension

    before = cpp_extension._jit_compile
    torch_extensions._patch_builds(cpp_extension)
    try:
        (tmp_path / "broken.cpp").write_text("this is not C++\n")
        with pytest.raises(RuntimeError, match="Error building extension 'hvd_probe_ext'"):
            cpp_extension.load("hvd_probe_ext", [str(tmp_path / "broken.cpp")],
                               build_directory=str(tmp_path))
        said = capsys.readouterr().err
        assert said.count("hvd_magics: building the PyTorch extension hvd_probe_ext, its first "
                          f"use on this host (half a minute to minutes, without a word; kept in "
                          f"{tmp_path} for later jobs)") == 1, said
        (tmp_path / "hvd_probe_ext.so").write_bytes(b"")  # built before: nothing said
        assert not torch_extensions.say_first_build("hvd_probe_ext", str(tmp_path))
    finally:
        cpp_extension._jit_compile = before


def test_a_lock_already_gone_is_released_without_an_error(tmp_path):
    """A DeepSpeed job failed with FileNotFoundError as a rank released its lock after
    building, its peer having found the same stale lock at that moment (suite, stop 77): the
    lock gone is what releasing it asks."""
    lock = tmp_path / "lock"
    baton = torch_baton.FileBaton(str(lock))
    assert baton.try_acquire() is True
    lock.unlink()
    baton.release()
    assert baton.fd is None and not lock.exists()
