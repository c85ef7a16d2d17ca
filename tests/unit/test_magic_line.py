"""%%horovod line parsing and the checks that run before anything starts, through a real shell."""
import re
import threading

import pytest
from IPython.core.error import UsageError

from hvd_magics.notebook import gpu_guard
from hvd_magics.notebook.magic_line import line_words
from hvd_magics.notebook.magics import HorovodMagics


def normalise_line(line: str) -> str:
    """``%%horovod``'s line as the words its parser is given, joined by spaces."""
    return " ".join(line_words(HorovodMagics.horovod.parser, line, "%%horovod"))


@pytest.mark.parametrize("line, message", [
    ("", "needs the number of ranks"),
    ("np=0", "np=0 runs nothing"),
    ("np=two", "np must be a whole number of ranks or MIN:MAX, got 'two'"),
    ("np=4:2", "np='4:2': an elastic job takes MIN:MAX with 1 <= MIN <= MAX"),
    ("np=0:2", "1 <= MIN <= MAX"),
    ("np=1:x", "np='1:x': an elastic job takes MIN:MAX"),
    ("np=1:2 --elastic-timeout -5", "elastic_timeout (--elastic-timeout) must be a positive"),
    ("np=1:2 --reset-limit -1", "reset_limit (--reset-limit) must be a whole number >= 0"),
    ("np=1:2 reset_limit=x", "reset_limit (--reset-limit) must be a whole number >= 0"),
    ("np=2 --bogus", "%%horovod: --bogus is not one of its options. Fix: %%horovod? lists"),
    ("np=2 --env NOEQUALS", "--env takes NAME=VALUE"),
    ("np=2 --return 1x", "--return takes variable names"),
    ("np=2 --start-timeout 0", "positive number of seconds"),
    ("np=2 --engine jax", "engine='jax' is not an engine: use 'horovod'"),
    ("np=1:2 engine=torch", "an elastic job (np=1:2) is Horovod's and this job runs on the torch"),
])
def test_bad_lines_are_usage_errors_with_one_clear_line(ip, line, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        ip.run_cell_magic("horovod", line, "x = 1\n")


def test_ipython_syntax_in_the_cell_is_refused(ip):
    with pytest.raises(UsageError, match="line 2 uses IPython syntax"):
        ip.run_cell_magic("horovod", "np=-2", "!echo hi\n")


def test_a_notebook_variable_that_cannot_travel_is_named(ip):
    ip.user_ns["mylock"] = threading.Lock()
    with pytest.raises(UsageError, match=r"notebook variable 'mylock'.*lock.*create it inside the cell"):
        ip.run_cell_magic("horovod", "np=-2", "with mylock:\n    pass\n")


def test_the_driver_gpu_guard_refuses_and_can_be_overridden(ip, monkeypatch):
    fake = [gpu_guard.GpuHolder("TensorFlow", "/physical_device:GPU:0")]  # simulated: no GPU here
    monkeypatch.setattr("hvd_magics.notebook.magics.driver_gpu_holders", lambda: fake)
    with pytest.raises(UsageError, match="TensorFlow holds /physical_device:GPU:0.*restart the kernel"):
        ip.run_cell_magic("horovod", "np=-1", "1\n")


def test_horovodrunner_style_and_dash_forms_parse_alike():
    assert normalise_line("np=4 start_timeout=30") == "--np 4 --start-timeout 30"
    assert normalise_line("-np 4 --env A=np=1") == "-np 4 --env A=np=1"
    assert normalise_line("np=2:4 elastic_timeout=60 reset_limit=3") == (
        "--np 2:4 --elastic-timeout 60 --reset-limit 3")
    assert normalise_line("np=2 engine=torch") == "--np 2 --engine torch"


def test_help_lists_the_options(ip):
    doc = ip.find_cell_magic("horovod").__doc__
    for option in ("--np", "--return", "--start-timeout", "--env", "--quiet", "--allow-driver-gpu", "-o",
                   "--elastic-timeout", "--reset-limit", "MIN:MAX", "--engine"):
        assert option in doc


@pytest.mark.parametrize("cell, names, unbound", [
    ("a = 1\n", "a,b", ["b"]),
    ("def f():\n    b = 2\n", "b", ["b"]),  # local to f: not the cell's
    ("def f():\n    global b\n    b = 2\nf()\n", "b", []),
    ("for i in range(3):\n    pass\nimport numpy as np\nwith open('x') as fh:\n    pass\n",
     "i,np,fh", []),
    ("try:\n    pass\nexcept Exception as err:\n    pass\n(w := 3)\n", "err,w", []),
    ("[q for q in range(3)]\n", "q", ["q"]),
    ("from os.path import *\n", "anything", []),  # cannot be told: let it run
])
def test_return_names_the_cell_never_binds_are_found_before_launch(cell, names, unbound):
    from hvd_magics.notebook.cell_capture import unbound_return_names

    assert unbound_return_names(cell, tuple(names.split(","))) == unbound


def test_a_return_name_the_cell_never_assigns_is_a_usage_error(ip):
    with pytest.raises(UsageError, match="--return model: the cell never assigns model"):
        ip.run_cell_magic("horovod", "np=-2 --return model", "history = 1\n")


@pytest.mark.parametrize("line, message", [
    ("start", "%hvd_pool start needs the number of ranks, e.g. %hvd_pool start np=2"),
    ("start np=0", "%hvd_pool start: np=0 runs nothing"),
    ("start np=1:2", "%hvd_pool start: np=1:2: a warm pool has a fixed number of ranks"),
    ("start np=2 --idle-timeout -1", "idle_timeout (--idle-timeout) must be a positive"),
])
def test_a_bad_pool_start_is_one_clear_line_and_starts_nothing(ip, line, message):
    from hvd_magics.job.session import SESSION

    with pytest.raises(UsageError, match=re.escape(message)):
        ip.run_line_magic("hvd_pool", line)
    assert SESSION.pool is None


def test_a_trailing_comment_is_not_an_argument(ip):
    """As the README writes them: `%hvd_stacks job        # each rank's Python stack`."""
    from hvd_magics.notebook.magic_line import without_comment

    assert without_comment("job        # each rank's Python stack") == "job"
    assert without_comment("np=2 --env TAG=a#b # why") == "np=2 --env TAG=a#b"
    assert without_comment("np=2 --env 'TAG=# kept'") == "np=2 --env 'TAG=# kept'"
    assert normalise_line("np=2   # two ranks") == "--np 2"
    with pytest.raises(UsageError, match="'nojob' is not a background job's handle"):
        ip.run_line_magic("hvd_stacks", "nojob   # each rank's Python stack")
    with pytest.raises(UsageError, match="np=0 runs nothing"):
        ip.run_cell_magic("horovod", "np=0  # none", "x = 1\n")


def test_the_cell_magics_usage_names_it_with_two_percent_signs(ip):
    usage = ip.find_cell_magic("horovod").__doc__
    assert usage.lstrip(": \n").startswith("%%horovod [-np NP]"), usage[:80]


def test_restarts_on_a_warm_pool_are_refused_with_the_way(ip):
    """``HorovodPool(np=2, restarts=1)`` was a TypeError and ``%hvd_pool start --restarts 1``
    'unrecognized arguments'."""
    from hvd_magics import HorovodPool

    with pytest.raises(ValueError, match=r"restarts \(--restarts\) on a warm pool: the pool "
                                         r"replaces a lost rank at its next cell\. Fix: .*a cold "
                                         r"job \(--cold\) with restarts"):
        HorovodPool(np=2, restarts=1)
    with pytest.raises(UsageError, match=r"^%hvd_pool start: restarts \(--restarts\) on a warm "
                                         r"pool.*\(--cold\)"):
        ip.run_line_magic("hvd_pool", "start np=2 --restarts 1")


def test_a_checkpoint_folder_with_a_nul_character_is_refused_before_the_job(ip):
    """A NUL typed into ``--checkpoint-dir`` surfaced as Python's bare ``ValueError: embedded
    null byte`` from deep inside the launch, naming neither the option nor the fix."""
    from hvd_magics import HorovodRunner

    with pytest.raises(ValueError, match=r"checkpoint_dir \(--checkpoint-dir\) holds a NUL "
                                         r"character.*Fix: "):
        HorovodRunner(np=-2, checkpoint_dir="/tmp/a\x00b")
    with pytest.raises(UsageError, match=r"checkpoint_dir \(--checkpoint-dir\) holds a NUL"):
        ip.run_cell_magic("horovod", "np=-2 --checkpoint-dir /tmp/a\x00b", "print(1)")


class _Ran(Exception):
    """Raised where a job would start: the test has what the magic gave the runner."""


def _runs(monkeypatch) -> list:
    """The options of each job the magic would run (none is run)."""
    from hvd_magics.job.runner import HorovodRunner

    seen: list = []

    def run_payload(self, *args, **kwargs):
        seen.append(self.options)
        raise _Ran

    monkeypatch.setattr(HorovodRunner, "run_payload", run_payload)
    return seen


@pytest.mark.parametrize("line", [
    """np=-2 --checkpoint-dir "/tmp/a b" --env "MSG=hello world" --env "Q=say 'hi'" """,
    """np=-2 checkpoint_dir='/tmp/a b' --env 'MSG=hello world' --env Q="say 'hi'" """,
])
def test_a_quoted_value_reaches_the_ranks_as_a_shell_gives_it(ip, monkeypatch, line):
    """The ranks got the folder `<notebook folder>/'/tmp/a b'` and a variable named `'MSG`: the
    line was split, quoted again and split once more without the shell's rules."""
    seen = _runs(monkeypatch)
    with pytest.raises(_Ran):
        ip.run_cell_magic("horovod", line, "x = 1\n")
    assert seen[0].checkpoint_dir == "/tmp/a b"
    assert dict(seen[0].env) == {"MSG": "hello world", "Q": "say 'hi'"}


@pytest.mark.parametrize("magic, line, message", [
    ("horovod", "np=2 np=3", "%%horovod: -np/--np is given twice (2, then 3). Fix: give it once"),
    ("horovod", "-np 2 --np=-2", "%%horovod: -np/--np is given twice (2, then -2)"),
    ("horovod", "np=-2 --restarts 1 restarts=2", "%%horovod: --restarts is given twice (1, then 2)"),
    ("horovod", "np=-2 --verbosity all driver_log_verbosity=debug",
     "%%horovod: --verbosity is given twice ('all', then 'debug')"),
    ("horovod", "np=-2 --checkpoint-dir /a --checkpoint-dir /b",
     "%%horovod: --checkpoint-dir is given twice ('/a', then '/b')"),
    ("horovod", "np=-2 --cold --cold", "%%horovod: --cold is given twice. Fix: give it once"),
    ("horovod", "np=-2 --env A=1 --env A=2", "%%horovod: --env A is given twice ('1', then '2')"),
    ("hvd_pool", "start np=-2 np=-3", "%hvd_pool: -np/--np is given twice (-2, then -3). Fix: "
                                      "give it once"),
])
def test_an_option_given_twice_is_refused_however_it_is_spelt(ip, magic, line, message):
    """``np=2 np=3`` (and ``%hvd_pool start np=-2 np=-3``) ran with the last value."""
    from hvd_magics.job.session import SESSION

    run = ip.run_cell_magic if magic == "horovod" else ip.run_line_magic
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        run(magic, line, *(["x = 1\n"] if magic == "horovod" else []))
    assert SESSION.pool is None


@pytest.mark.parametrize("magic, line, message", [
    ("horovod", "np=-2 --restarts 1.5",
     "%%horovod: restarts (--restarts) must be a whole number >= 0 (how many times a job starts "
     "again after losing a rank), got 1.5. Fix: restarts=1, say"),
    ("horovod", "np=-2 --start-timeout abc",
     "%%horovod: start_timeout (--start-timeout) must be a positive number of seconds, got "
     "'abc'. Fix: start_timeout=30, say"),
    ("horovod", "np=-2 --epochs 3",
     "%%horovod: --epochs is not one of its options. Fix: %%horovod? lists them (a setting of "
     "your own code goes in the cell)"),
    ("horovod", "np=-2 --checkpoint-dir",
     "%%horovod: argument --checkpoint-dir: expected one argument. Fix: %%horovod? shows each "
     "option and the value it takes"),
    ("horovod", "np=-2 --verbosity loud",
     "%%horovod: driver_log_verbosity (--verbosity) must be one of all, log_callback_only, "
     "debug, got 'loud'. Fix: driver_log_verbosity='log_callback_only'"),
    ("horovod", 'np="2', "%%horovod: cannot read the line (No closing quotation). Fix: close "
                        "the quote"),
    ("hvd_pool", "start np=-2 --restarts 1.5",
     "%hvd_pool start: restarts (--restarts) must be a whole number >= 0"),
    ("hvd_pool", "start np=-2 --idle-timeout abc",
     "%hvd_pool start: idle_timeout (--idle-timeout) must be a positive number of seconds, got "
     "'abc'. Fix: idle_timeout=30, say"),
    ("hvd_pool", "start np=-2 --epochs 3", "%hvd_pool: --epochs is not one of its options"),
    ("hvd_pool", "start np=-2 --env X", "%hvd_pool: --env takes NAME=VALUE, got 'X'. Fix: "
                                        "--env X=VALUE"),
    ("hvd_pool", 'start np="2', "%hvd_pool: cannot read the line (No closing quotation)"),
    ("hvd_pool", "begin", "%hvd_pool: argument action: invalid choice: 'begin'"),
])
def test_a_wrong_value_is_our_one_line_naming_the_magic_the_option_and_the_fix(
        ip, magic, line, message):
    """argparse's own words came without ``%%horovod:`` or a fix (``argument --restarts:
    invalid int value: '1.5'``), and ``%hvd_pool``'s errors named ``%%horovod``."""
    from hvd_magics.job.session import SESSION

    run = ip.run_cell_magic if magic == "horovod" else ip.run_line_magic
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        run(magic, line, *(["x = 1\n"] if magic == "horovod" else []))
    assert SESSION.pool is None


@pytest.mark.parametrize("magic, line", [
    ("horovod", 'np=-2 --checkpoint-dir ""'),
    ("horovod", "np=-2 checkpoint_dir=''"),
    ("horovod", "np=-2 --checkpoint-dir '  '"),
    ("hvd_pool", 'start np=-2 --checkpoint-dir ""'),
])
def test_an_empty_checkpoint_folder_is_refused_as_the_runner_refuses_it(ip, magic, line):
    """``--checkpoint-dir ""`` used a folder named ``''`` while ``HorovodRunner(checkpoint_dir="")``
    silently used the default."""
    from hvd_magics import HorovodRunner

    message = (r"checkpoint_dir \(--checkpoint-dir\) is '\s*', which names no folder\. Fix: a "
               r"folder's path \(checkpoint_dir='/dbfs/checkpoints/run1', --checkpoint-dir "
               r"/dbfs/checkpoints/run1\), or leave it out")
    with pytest.raises(ValueError, match=message):
        HorovodRunner(np=-2, checkpoint_dir="")
    run = ip.run_cell_magic if magic == "horovod" else ip.run_line_magic
    with pytest.raises(UsageError, match=message):
        run(magic, line, *(["x = 1\n"] if magic == "horovod" else []))


def test_the_pool_takes_a_checkpoint_folder_for_its_cells(ip, monkeypatch):
    """``%hvd_pool start --checkpoint-dir DIR`` was 'unrecognized arguments', though a pool's
    cells save checkpoints as a cold job's do."""
    from hvd_magics.job.session import SESSION

    started: list = []

    class Pool:
        def __init__(self, *args, **kwargs):
            started.append((args, kwargs))

    monkeypatch.setattr("hvd_magics.notebook.magics.HorovodPool", Pool)
    ip.run_line_magic("hvd_pool", 'start np=-2 --checkpoint-dir "/shared/pool a" '
                                  '--env "MSG=hello world"')
    SESSION.pool = None
    (np, env, *_), kwargs = started[0]
    assert (np, env, kwargs["checkpoint_dir"]) == (-2, {"MSG": "hello world"}, "/shared/pool a")
