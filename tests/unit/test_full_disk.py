"""A full disk said as such (issue 82, item 6): DCP's error of a sharded save that filled the
checkpoint folder's disk read ``CheckpointException ranks:dict_keys([0])`` and named no disk,
and the job's log lost its lines. Real disks of their own (tmpfs), real DCP."""
import errno

import pytest

from hvd_magics.job.records.job_log import JobLog
from hvd_magics.rank.api.disk_full import disk_full, no_room
from tests.full_disk import fill, small_disk


def test_dcp_s_error_of_a_full_disk_is_found_and_said_with_the_folder_and_its_room(tmp_path):
    import torch  # here: the quick tier's lanes import torch only where a test uses it

    from hvd_magics.rank.api import torch_dcp

    with small_disk(tmp_path / "disk", "256k") as disk:
        (disk / "checkpoints").mkdir()
        partial = disk / "checkpoints" / ".ckpt-3-e0-s0.dcp.partial-a0"
        with pytest.raises(BaseException) as raised:  # DCP's CheckpointException
            torch_dcp.save({"model": torch.nn.Linear(512, 512)}, partial)
        assert "No space" not in str(raised.value)  # DCP's own words name no disk
        found = no_room(raised.value)
        assert found is not None and found.errno == errno.ENOSPC, raised.value
        error = disk_full(disk, 3, partial, None)
        said = str(error)
        assert said.startswith(f"the disk of the checkpoint folder {disk} is full: the "
                               f"checkpoint of step 3 did not fit ("), said
        assert " free of 262.1 KB once it was removed; " in said, said
        assert "no whole checkpoint is there yet" in said and "Fix: free room" in said, said
        assert not partial.exists()


def test_other_errors_are_not_taken_for_a_full_disk():
    assert no_room(OSError(errno.EACCES, "Permission denied")) is None
    assert no_room(RuntimeError("No space left on device")) is None  # words are not a cause
    inner = OSError(errno.EDQUOT, "Disk quota exceeded")
    outer = RuntimeError("wrapped")
    outer.__cause__ = inner
    assert no_room(outer) is inner


def test_the_job_s_log_keeps_the_lines_a_full_disk_had_no_room_for(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        log = JobLog(disk / "runs" / "ranks.log")
        log.write("first\n")
        filler = fill(disk)
        long = "while full " + "x" * 10_000 + "\n"  # past the page the file already has
        log.write(long)
        assert log.waiting > 0
        filler.unlink()  # room again (a partly written checkpoint removed)
        log.write("after\n")
        log.close()
        assert (disk / "runs" / "ranks.log").read_text() == f"first\n{long}after\n"


def test_a_line_longer_than_what_waits_for_room_is_written_whole(tmp_path):
    """Only what a full disk keeps waiting is bounded: a rank's 40 MB line was cut to 16 MiB."""
    from hvd_magics.job.records.job_log import WAITING_BOUND

    log = JobLog(tmp_path / "ranks.log")
    log.write("x" * (WAITING_BOUND + 1000) + "\n")
    log.close()
    assert (tmp_path / "ranks.log").stat().st_size == WAITING_BOUND + 1001
    assert log.dropped == 0
