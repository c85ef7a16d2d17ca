"""A job's options as HorovodRunner and HorovodPool take them: each wrong value refused with the
option's name and the fix, as the magics refuse it (options.py's checks, once for all)."""
import re
from types import SimpleNamespace

import pytest

from hvd_magics import HorovodPool, HorovodRunner

#: A wrong keyword of both the runner and the pool, and the whole message it gets.
WRONG = [
    ({"np": "-2"}, "np takes a number, not text: got '-2'. Fix: np=-2"),
    ({"restarts": "1"}, "restarts (--restarts) takes a number, not text: got '1'. Fix: restarts=1"),
    ({"start_timeout": "30"}, "start_timeout (--start-timeout) takes a number, not text: got "
                              "'30'. Fix: start_timeout=30"),
    ({"np": 4, "ranks_per_task": "2"}, "ranks_per_task (--ranks-per-task) takes a number, not "
                                       "text: got '2'. Fix: ranks_per_task=2"),
    ({"env": ["FOO"]}, "env takes a dict of variable names to values, got list ['FOO']. Fix: "
                       "env={'FOO': '1'} (%%horovod --env FOO=1)"),
    ({"env": "FOO"}, "env takes a dict of variable names to values, got str 'FOO'. Fix: "
                     "env={'FOO': '1'} (%%horovod --env FOO=1)"),
    ({"env": {"FOO": None}}, "env['FOO'] is None, and an environment variable's value is text. "
                             "Fix: env={'FOO': '1'}, or leave FOO out"),
    ({"env": {"N": 4}}, "env['N'] is 4, and an environment variable's value is text. Fix: "
                        "env={'N': '4'}, or leave N out"),
    ({"env": {"A=B": "1"}}, "env: 'A=B' cannot name an environment variable."),
    ({"checkpoint_dir": ""}, "checkpoint_dir (--checkpoint-dir) is '', which names no folder. "
                             "Fix: a folder's path"),
    ({"checkpoint_dir": 3}, "checkpoint_dir (--checkpoint-dir) takes a folder's path, got 3."),
]


@pytest.mark.parametrize("keywords, message", WRONG + [
    ({"fresh": "no"}, "fresh (--fresh) takes True or False, got 'no'. Fix: fresh=True"),
    ({"timeline_mark_cycles": "yes"}, "timeline_mark_cycles takes True or False, got 'yes'."),
    ({"timeout": "60"}, "timeout (--timeout) takes a number, not text: got '60'. Fix: timeout=60"),
    ({"stall_after": True}, "stall_after (--stall-after) must be a positive number of seconds"),
])
def test_the_runner_refuses_a_wrong_value_with_the_fix(keywords, message):
    """``env=["FOO"]`` and ``env="FOO"`` raised a raw AttributeError, ``env={"FOO": None}``
    reached the ranks as ``"None"``, ``fresh="no"`` was taken as true, ``restarts="1"`` was
    refused while ``np="-2"`` was accepted, ``checkpoint_dir=""`` used the default."""
    keywords = {"np": -2, **keywords}
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        HorovodRunner(**keywords)


@pytest.mark.parametrize("keywords, message", WRONG)
def test_the_pool_refuses_them_alike_before_any_rank_starts(keywords, message):
    keywords = {"np": -2, **keywords}
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        HorovodPool(**keywords)


def test_right_values_are_taken_as_they_are():
    runner = HorovodRunner(np=-2, env={"MSG": "hello world"}, fresh=True, restarts=1,
                           checkpoint_dir="/tmp/a b", start_timeout=30)
    assert runner.options.env == {"MSG": "hello world"}
    assert (runner.options.fresh, runner.options.restarts) == (True, 1)
    assert runner.options.checkpoint_dir == "/tmp/a b"
    assert HorovodRunner(np="2:4").elastic is not None  # MIN:MAX is text by nature


def _folder_of(monkeypatch, runner) -> object:
    """The checkpoint folder the runner's job would take (nothing is launched)."""
    from hvd_magics.launch.payload import JobPayload

    folders: list = []
    monkeypatch.setattr("hvd_magics.job.runner.run_job",
                        lambda request, restarts, folder, *rest: folders.append(folder))
    runner.run_payload(JobPayload(b""), [], source="print('a cell')\n")
    return folders[0]


def test_a_pools_jobs_keep_their_checkpoint_folders_under_its_own(monkeypatch, tmp_path):
    """A pool had no ``checkpoint_dir``: on a cluster each cell needed its own
    ``--checkpoint-dir`` for a folder the executors share."""
    pool = SimpleNamespace(np=-2, engine="horovod", ranks_per_task=None,
                           checkpoint_dir=str(tmp_path))
    cell = _folder_of(monkeypatch, HorovodRunner(np=-2, pool=pool))
    assert cell.parent == tmp_path  # one folder per cell, under the pool's
    assert _folder_of(monkeypatch, HorovodRunner(np=-2, pool=pool)) == cell
    own = tmp_path / "own"
    assert _folder_of(monkeypatch, HorovodRunner(np=-2, pool=pool, checkpoint_dir=str(own))) \
        == own
