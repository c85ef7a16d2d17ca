"""%%horovod through a real IPython shell on local Spark: capture, return values, errors."""
import pytest

from hvd_magics import HorovodJobError
from hvd_magics.job.session import SESSION
from tests.conftest import rank_processes_alive


def test_a_cell_uses_notebook_definitions_and_brings_values_back(ip, local_spark, capsys):
    ip.run_cell("import math\nscale = 10\ndef describe(n):\n    return f'{n} ranks'\n")
    cell = ("import horovod.torch as hvd\nimport torch\nhvd.init()\n"
            "total = hvd.allreduce(torch.tensor([float(scale)]), op=hvd.Sum).item()\n"
            "print('rank', hvd.rank(), 'total', total)\n"
            "label = describe(hvd.size())\nmath.floor(total) + hvd.rank()\n")
    value = ip.run_cell_magic("horovod", "np=2 --return total,label -o rec", cell)
    assert value == 20  # rank 0's last expression
    assert ip.user_ns["total"] == 20.0 and ip.user_ns["label"] == "2 ranks"
    record = ip.user_ns["rec"]
    assert record is SESSION.last_run and record.status == "succeeded"
    assert record.returned == {"total": 20.0, "label": "2 ranks"} and record.value == 20
    out = capsys.readouterr().out
    assert "[0] rank 0 total 20.0" in out and "[1] rank 1 total 20.0" in out
    assert rank_processes_alive(record.pids.values()) == []


def test_a_failing_cell_shows_the_rank_traceback_with_cell_lines(ip, local_spark):
    cell = ("import os\nrank = int(os.environ['HOROVOD_RANK'])\n"
            "if rank == 1:\n    raise RuntimeError('bad shard on rank 1')\n")
    with pytest.raises(HorovodJobError) as info:
        ip.run_cell_magic("horovod", "np=2 -q", cell)
    text = "\n".join(info.value._render_traceback_())
    assert 'File "<%%horovod cell>", line 5' in text
    assert "raise RuntimeError('bad shard on rank 1')" in text
    assert "[rank 1] RuntimeError: bad shard on rank 1" in text
    assert "cell_capture.py" not in text and "rank_main.py" not in text  # the user's frames only
    assert SESSION.last_run.status == "failed"


def test_quiet_hides_output_and_driver_mode_works(ip, capsys):
    assert ip.run_cell_magic("horovod", "-np -2 --quiet", "print('hidden')\n41 + 1\n") == 42
    assert "hidden" not in capsys.readouterr().out


def test_hvd_env_on_a_local_master_ships_nothing_and_says_so(ip, local_spark, capsys):
    from IPython.core.error import UsageError

    ip.run_line_magic("hvd_env", "")
    assert "not shipped" in capsys.readouterr().out
    ip.run_line_magic("hvd_env", "ship  # the kernel's own environment")
    said = capsys.readouterr()
    assert "master is local[2]: its executors run this very Python, so nothing is packed" \
        in said.err
    assert said.out.startswith("Shipped to the executors of a cluster: venv ")
    assert SESSION.environment is not None
    # a job on the local master runs as before, in this Python
    value = ip.run_cell_magic("horovod", "np=2 -q", "import sys\nsys.executable")
    import sys

    assert value == sys.executable
    ip.run_line_magic("hvd_env", "off")
    assert SESSION.environment is None and "not shipped" in capsys.readouterr().out
    with pytest.raises(UsageError, match="invalid choice: 'shp'"):
        ip.run_line_magic("hvd_env", "shp")
    with pytest.raises(UsageError, match="is not a virtual environment or a conda environment"):
        ip.run_line_magic("hvd_env", "ship /tmp")
    assert SESSION.environment is None
