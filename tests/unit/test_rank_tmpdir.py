"""The keeper's tidying of a rank's private temporary folder."""
import os

from hvd_magics.rank.rank_main import clean_rank_tmpdir


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


def test_no_folder_or_a_missing_one_is_fine(tmp_path):
    clean_rank_tmpdir(None)
    clean_rank_tmpdir(str(tmp_path / "gone"))
