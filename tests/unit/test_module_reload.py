"""A warm pool's rank notes the user's modules once and reloads the ones whose files changed."""
import sys

from hvd_magics.rank import module_reload
from hvd_magics.rank.module_reload import ModuleWatch


def _count_looks(monkeypatch):
    looked = []
    real = module_reload._user_file

    def user_file(module):
        looked.append(module)
        return real(module)

    monkeypatch.setattr(module_reload, "_user_file", user_file)
    return looked


def test_each_module_is_looked_at_once_not_after_every_cell(monkeypatch):
    """A rank that imported torch holds ~1,500 modules; resolving each one's path after every
    cell cost a warm pool 40 ms a cell."""
    looked = _count_looks(monkeypatch)
    watch = ModuleWatch()
    watch.remember()
    assert len(looked) >= len(sys.modules) - 5  # the first call looks at every module
    looked.clear()
    watch.remember()
    assert looked == []


def test_a_module_imported_later_is_noted_and_reloaded_when_its_file_changes(tmp_path,
                                                                             monkeypatch):
    watch = ModuleWatch()
    watch.remember()
    (tmp_path / "users_helper_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import users_helper_mod

        watch.remember()
        assert "users_helper_mod" in watch.stamps and watch.reload_changed() == []
        (tmp_path / "users_helper_mod.py").write_text("VALUE = 22\n")  # another size
        assert watch.reload_changed() == ["users_helper_mod"]
        assert users_helper_mod.VALUE == 22
    finally:
        sys.modules.pop("users_helper_mod", None)
