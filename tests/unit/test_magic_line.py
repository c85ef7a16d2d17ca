"""%%horovod line parsing and the checks that run before anything starts, through a real shell."""
import re
import threading

import pytest
from IPython.core.error import UsageError

from hvd_magics import gpu_guard
from hvd_magics.magics import normalise_line


@pytest.mark.parametrize("line, message", [
    ("", "needs the number of ranks"),
    ("np=0", "np=0 runs nothing"),
    ("np=two", "invalid int value: 'two'"),
    ("np=2 --bogus", "unrecognized arguments: --bogus"),
    ("np=2 --env NOEQUALS", "--env takes NAME=VALUE"),
    ("np=2 --return 1x", "--return takes variable names"),
    ("np=2 --start-timeout 0", "positive number of seconds"),
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
    monkeypatch.setattr("hvd_magics.magics.driver_gpu_holders", lambda: fake)
    with pytest.raises(UsageError, match="TensorFlow holds /physical_device:GPU:0.*restart the kernel"):
        ip.run_cell_magic("horovod", "np=-1", "1\n")


def test_horovodrunner_style_and_dash_forms_parse_alike():
    assert normalise_line("np=4 start_timeout=30") == "--np 4 --start-timeout 30"
    assert normalise_line("-np 4 --env A=np=1") == "-np 4 --env A=np=1"


def test_help_lists_the_options(ip):
    doc = ip.find_cell_magic("horovod").__doc__
    for option in ("--np", "--return", "--start-timeout", "--env", "--quiet", "--allow-driver-gpu", "-o"):
        assert option in doc
