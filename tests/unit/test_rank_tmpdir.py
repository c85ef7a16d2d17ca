"""The keeper's tidying of a rank's private temporary folder."""
import os

from hvd_magics.common.rank_tmpdir import clean_rank_tmpdir


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("x")


def test_leftovers_of_exit_hooks_go_and_then_the_empty_folder(tmp_path):
    folder = tmp_path / "hvd_magics-rank-a"
    _touch(folder / "__autograph_generated_filex1y2.py")
    _touch(folder / "__pycache__" / "__autograph_generated_filex1y2.cpython-311.pyc")
    clean_rank_tmpdir(str(folder))
    assert not folder.exists()


def test_what_the_users_code_left_stays(tmp_path):
    folder = tmp_path / "hvd_magics-rank-b"
    _touch(folder / "__autograph_generated_filez.py")
    _touch(folder / "model.keras")
    _touch(folder / "__pycache__" / "mine.cpython-311.pyc")
    clean_rank_tmpdir(str(folder))
    assert sorted(os.listdir(folder)) == ["__pycache__", "model.keras"]
    assert os.listdir(folder / "__pycache__") == ["mine.cpython-311.pyc"]


def test_empty_folders_frameworks_made_go_too(tmp_path):
    folder = tmp_path / "hvd_magics-rank-c"
    (folder / "torchinductor_me" / "fxgraph").mkdir(parents=True)
    clean_rank_tmpdir(str(folder))
    assert not folder.exists()


def test_the_rank_keeps_the_shared_inductor_cache(tmp_path, monkeypatch):
    import getpass
    import tempfile

    from hvd_magics.common.rank_tmpdir import use_tmpdir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    use_tmpdir(str(tmp_path / "private"))
    assert tempfile.gettempdir() == os.environ["TMPDIR"] == str(tmp_path / "private")
    shared_cache = tmp_path / f"torchinductor_{getpass.getuser()}"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(shared_cache)


def test_no_folder_or_a_missing_one_is_fine(tmp_path):
    clean_rank_tmpdir(None)
    clean_rank_tmpdir(str(tmp_path / "gone"))
