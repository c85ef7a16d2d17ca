"""How many run log folders the driver keeps."""
import os

from hvd_magics.job.records import run_logs


def _runs(root, count):
    for i in range(count):
        folder = root / f"run{i:03d}"
        folder.mkdir(parents=True)
        (folder / "ranks.log").write_text("line\n")
        os.utime(folder / "ranks.log", (1000 + i, 1000 + i))
        os.utime(folder, (1000 + i, 1000 + i))


def test_the_oldest_go_leaving_room_for_the_next_job(tmp_path):
    _runs(tmp_path, 6)
    (tmp_path / "stray.txt").write_text("not a run")
    removed = run_logs.prune_old_runs(tmp_path, keep=4)
    assert sorted(p.name for p in removed) == ["run000", "run001", "run002"]
    assert sorted(os.listdir(tmp_path)) == ["run003", "run004", "run005", "stray.txt"]


def test_a_run_still_writing_its_log_is_not_old(tmp_path):
    _runs(tmp_path, 4)
    os.utime(tmp_path / "run000" / "ranks.log", (5000, 5000))  # a long job, still logging
    run_logs.prune_old_runs(tmp_path, keep=3)
    assert sorted(os.listdir(tmp_path)) == ["run000", "run003"]


def test_fewer_than_the_limit_are_all_kept_and_a_missing_folder_is_fine(tmp_path):
    _runs(tmp_path, 3)
    assert run_logs.prune_old_runs(tmp_path, keep=4) == []
    assert run_logs.prune_old_runs(tmp_path / "none", keep=4) == []


def test_the_limit_comes_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv(run_logs.ENV_KEEP_RUNS, "7")
    assert run_logs.keep_runs() == 7
    monkeypatch.setenv(run_logs.ENV_KEEP_RUNS, "0")
    assert run_logs.keep_runs() == 1
    monkeypatch.setenv(run_logs.ENV_KEEP_RUNS, "lots")
    assert run_logs.keep_runs() == run_logs.DEFAULT_KEEP_RUNS
    assert "HVD_MAGICS_KEEP_RUNS='lots' is not a whole number" in caplog.text
    monkeypatch.delenv(run_logs.ENV_KEEP_RUNS)
    assert run_logs.keep_runs() == run_logs.DEFAULT_KEEP_RUNS


def test_a_ranks_traceback_leaves_out_our_wrappers_between_its_code_and_the_library():
    """A survivor's ``dist.barrier()`` showed the step split's wrapper twice between the cell's
    line and torch's; the user's frames and the library's stay, and a last frame of ours (an
    error raised there) would too."""
    from hvd_magics.rank import rank_main
    from hvd_magics.rank.instruments import step_split

    def library_call():
        raise RuntimeError("Connection closed by peer")

    def users_cell(call):
        call()

    # the wrapper between two frames of the user's and the library's, and last (the library's
    # own wait, in C, raised: torch's Work.wait is wrapped)
    for call, library in ((step_split._timed(step_split._COMM, library_call), True),
                          (step_split._timed(step_split._COMM, int.__call__), False)):
        try:
            users_cell(lambda: call() if library else call("x"))
        except (RuntimeError, ValueError) as exc:
            text = rank_main._format_exception(exc)
        assert "users_cell" in text and ("library_call" in text) == library, text
        assert "step_split.py" not in text, text
    # an error raised in our own code keeps its frame
    try:
        step_split._add_cpu(None, None, (0.0, 0.0))
    except (TypeError, AttributeError) as exc:
        assert "step_split.py" in rank_main._format_exception(exc)


def test_a_cells_frames_stay_in_its_traceback_whatever_the_rank_s_working_folder(monkeypatch):
    """A cell's code has a pseudo-file name (``<%%horovod cell 3>``), which the path test made
    a file of the working folder: a rank working inside the package lost the cell's frames."""
    from pathlib import Path

    from hvd_magics.rank import rank_main

    monkeypatch.chdir(Path(rank_main.__file__).parent)
    code = compile("def cells_own():\n    raise ValueError('bad input')\ncells_own()\n",
                   "<%%horovod cell 3>", "exec")
    try:
        exec(code, {})  # noqa: S102 - a cell, as the rank runs it
    except ValueError as exc:
        text = rank_main._format_exception(exc)
    # both of the cell's frames: its top level's call, and the function that raised
    assert text.count('File "<%%horovod cell 3>"') == 2 and "cells_own" in text, text
