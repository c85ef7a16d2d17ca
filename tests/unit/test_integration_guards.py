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
