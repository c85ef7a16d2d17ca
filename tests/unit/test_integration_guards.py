"""What the libraries' integrations share (hvd_magics.rank.integrations.guards): a warning of
ours said at the user's line, whatever stands between (our patches, the library's frames)."""
import os
import sysconfig
import warnings

import hvd_magics.rank
from hvd_magics.errors import HorovodMagicsWarning
from hvd_magics.rank.cell_runner import CELL_FILENAME
from hvd_magics.rank.guards.import_hooks import after_call
from hvd_magics.rank.integrations.guards import warn_at_users_line

#: A library's module, as if installed (what the frames say is all that is looked at).
LIBRARY_SOURCE = """
class Trainer:
    def __init__(self):
        self.made = True


class SubTrainer(Trainer):
    def __init__(self):
        super().__init__()
"""
#: Our integration's patch (in hvd_magics' folder, as the Trainer's is).
OURS_SOURCE = """
def say(made):
    warn_at_users_line("said")
"""
#: The user's cell: line 3 makes the Trainer, line 4 the library's subclass.
CELL = "x = 1\n\ntrainer = Trainer()\nsub = SubTrainer()\n"


def _library() -> dict:
    namespace: dict = {"__name__": "fakelib.trainer"}
    path = f"{sysconfig.get_paths()['purelib']}/fakelib/trainer.py"
    exec(compile(LIBRARY_SOURCE, path, "exec"), namespace)  # noqa: S102 - the test's library
    return namespace


def _ours() -> dict:
    namespace: dict = {"__name__": "hvd_magics.rank.integrations.fake",
                       "warn_at_users_line": warn_at_users_line}
    path = os.path.join(os.path.dirname(hvd_magics.rank.__file__), "integrations", "fake.py")
    exec(compile(OURS_SOURCE, path, "exec"), namespace)  # noqa: S102 - the test's integration
    return namespace


def test_a_warning_of_ours_is_said_at_the_user_s_line_past_two_patches_and_a_subclass():
    """The Trainer's FSDP-on-CPU warning, issued with a fixed stacklevel from a patch of its
    ``__init__``, was said at ``rank/guards/import_hooks.py:69`` in a job of several ranks:
    there the guard's patch wraps the progress patch, one frame deeper."""
    library = _library()
    trainer = library["Trainer"]
    after_call(trainer, "__init__", _ours()["say"], "_mark_progress")
    after_call(trainer, "__init__", lambda made: None, "_mark_alone_guard")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        exec(compile(CELL, CELL_FILENAME, "exec"), {**library, "__name__": "__main__"})  # noqa: S102
    assert [(w.category, w.filename, w.lineno, str(w.message)) for w in said] == [
        (HorovodMagicsWarning, CELL_FILENAME, 3, "said"),
        (HorovodMagicsWarning, CELL_FILENAME, 4, "said")]


def test_a_warning_of_ours_called_from_the_user_s_file_is_said_there():
    def library_call():
        warn_at_users_line("said")

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        library_call()  # this test's file is the user's: its line is found
    assert said[0].filename == __file__ and said[0].category is HorovodMagicsWarning


def test_a_patch_runs_on_its_module_only_when_one_zip_loads_it_and_the_modules_it_imports(
        tmp_path, monkeypatch):
    """On executors our package is a zip on the path, one zipimporter loading every module of
    it: the patch of ``hvd_magics.rank.api.shard`` (a shard's passes) ran on
    ``shard_columns``, which shard imports while it loads, and every rank reading a DataFrame
    failed with ``partially initialized module ... has no attribute 'when_a_pass_begins'``."""
    import sys
    import zipfile

    from hvd_magics.rank.guards import import_hooks

    archive = tmp_path / "shipped.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("zpkg/__init__.py", "")
        zipped.writestr("zpkg/shard.py", "from zpkg import shard_columns\nHOOK = 'shard'\n")
        zipped.writestr("zpkg/shard_columns.py", "COLUMNS = 1\n")
    monkeypatch.syspath_prepend(str(archive))
    patched = []
    monkeypatch.setattr(import_hooks, "_PATCHES", {})
    try:
        import_hooks.after_import(("zpkg.shard",), lambda module: patched.append(
            (module.__name__, module.HOOK)))
        import zpkg.shard  # noqa: F401 - imported to run the patch
        assert patched == [("zpkg.shard", "shard")]
    finally:
        sys.meta_path.remove(import_hooks._FINDER)
        for name in ("zpkg", "zpkg.shard", "zpkg.shard_columns"):
            sys.modules.pop(name, None)
