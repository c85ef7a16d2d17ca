"""What a task does with a shipped environment before its rank starts (no Spark: the archive's
folder is made here, in the task's working folder, where Spark Connect unpacks artifacts)."""
import sys

import pytest

from hvd_magics.errors import EnvironmentNotShippable
from hvd_magics.launch import environment_shipping
from hvd_magics.protocol import ENV_RANK_PYTHON, ENV_SHIPPED_ENVIRONMENT, ENV_SHIPPED_PYTHON
from hvd_magics.task.shipped_environment import ShippedEnvironmentUnusable, rank_python

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _archive(folder, python_script: str | None):
    (folder / "hvd_env_k" / "bin").mkdir(parents=True)
    python = folder / "hvd_env_k" / "bin" / "python"
    if python_script is None:  # a venv's link to an interpreter this host lacks
        python.symlink_to("/nonexistent/python3.11")
    else:
        python.write_text(python_script)
        python.chmod(0o755)
    return str(python)


def test_a_job_without_a_shipped_environment_keeps_the_executors_python():
    assert rank_python({}) == {}


def test_the_shipped_interpreter_is_used_when_it_runs_the_same_python(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    python = _archive(tmp_path, f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    job = {ENV_SHIPPED_ENVIRONMENT: "hvd_env_k", ENV_SHIPPED_PYTHON: HERE}
    assert rank_python(job) == {ENV_RANK_PYTHON: python}


def test_another_python_on_the_executor_is_refused_naming_conda_pack(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _archive(tmp_path, "#!/bin/sh\necho 3.9\n")
    with pytest.raises(ShippedEnvironmentUnusable) as info:
        rank_python({ENV_SHIPPED_ENVIRONMENT: "hvd_env_k", ENV_SHIPPED_PYTHON: HERE})
    text = str(info.value)
    assert f"packed for Python {HERE}, but its interpreter on the executor" in text
    assert "Python 3.9" in text and "conda-pack carries the interpreter" in text


def test_a_missing_interpreter_is_refused_naming_where_it_should_be(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _archive(tmp_path, None)
    with pytest.raises(ShippedEnvironmentUnusable) as info:
        rank_python({ENV_SHIPPED_ENVIRONMENT: "hvd_env_k", ENV_SHIPPED_PYTHON: "3.11"})
    text = str(info.value)
    assert "does not run on the executor" in text and "/nonexistent/python3.11" in text
    assert "A venv does not carry its interpreter" in text


def test_what_is_not_an_environment_or_too_large_is_refused_with_the_fix(tmp_path):
    with pytest.raises(EnvironmentNotShippable) as info:
        environment_shipping.environment_facts(tmp_path)
    assert "is not a virtual environment or a conda environment" in str(info.value)
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "big").write_bytes(b"x" * 3000)
    facts = environment_shipping.environment_facts(tmp_path, measure=True)
    assert facts.kind == "venv" and facts.size >= 3000
    with pytest.raises(EnvironmentNotShippable) as info:
        environment_shipping.packed_environment(facts, print, limit_gb=1e-6)
    assert "over the limit of 1e-06 GB" in str(info.value)
    assert "ship_environment(limit_gb=" in str(info.value)


def test_what_ship_environment_returns_shows_as_one_line_in_a_notebook():
    """A notebook cell ending in ship_environment() showed the dataclass's whole repr after
    the line it had said."""
    import sys

    from hvd_magics.launch.environment_shipping import EnvironmentChoice

    assert repr(EnvironmentChoice()) == \
        f"<shipped environment {sys.prefix}: not sent to a cluster yet>"


def _venv_of(folder, files: int = 0, size: int = 0):
    """A real virtual environment (no pip) with ``files`` files of ``size`` random bytes in a
    package of its site-packages, and a pyspark standalone worker's folder beside it."""
    import os
    import subprocess
    import sys as system

    subprocess.run([system.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next(folder.glob("lib/python*/site-packages"))
    (site / "heavy").mkdir()
    for number in range(files):
        (site / "heavy" / f"part{number}.bin").write_bytes(os.urandom(size))
    work = site / "pyspark" / "work" / "app-1"
    work.mkdir(parents=True)
    (work / "unpacked-env.bin").write_bytes(b"\0" * 3_000_000)  # earlier jobs' environments
    return folder


def test_spark_work_folders_do_not_travel_and_a_refusal_names_the_largest_parts(tmp_path,
                                                                                monkeypatch):
    """A pip-installed pyspark's pyspark/work (9.9 GB of earlier unpacked environments) was
    counted and packed: '15.1 GB unpacked' for a 5 GB venv, with nothing said of what is large."""
    import tarfile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    prefix = _venv_of(tmp_path / "env", files=2, size=1_000_000)
    facts = environment_shipping.environment_facts(prefix, measure=True)
    assert 2_000_000 <= facts.size < 2_500_000, facts.size  # the work folder's 3 MB not counted
    assert facts.largest[0][0].endswith("site-packages/heavy"), facts.largest
    with pytest.raises(EnvironmentNotShippable, match=r"over the limit of 0\.001 GB that every "
                       r"executor would download and unpack \(largest: lib/python3\.\d+/"
                       r"site-packages/heavy 2\.0 MB"):
        environment_shipping.packed_environment(facts, lambda *a, **k: None, limit_gb=0.001)
    archive = environment_shipping.packed_environment(facts, lambda *a, **k: None)
    with tarfile.open(archive) as packed:
        names = packed.getnames()
    assert any(n.endswith("heavy/part0.bin") for n in names)
    assert not [n for n in names if "pyspark/work" in n]


def test_an_interrupt_while_packing_stops_the_pack_and_the_next_call_packs(tmp_path, monkeypatch):
    """The packing thread went on after the interrupt; the next call failed with
    FileNotFoundError ... .part-<pid>."""
    import os
    import signal
    import threading
    import time

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    facts = environment_shipping.environment_facts(
        _venv_of(tmp_path / "env", files=40, size=2_000_000))
    said = []
    packing = threading.Event()

    def say(text, redraw=False):
        said.append(text)
        if text.startswith("packing") and redraw:
            packing.set()

    def interrupt():
        packing.wait(60)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(environment_shipping, "PROGRESS_EVERY_S", 0.05)
    threading.Thread(target=interrupt, daemon=True).start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        environment_shipping.packed_environment(facts, say)
    assert time.monotonic() - began < 30
    assert said[-1].endswith("was interrupted; stopped"), said[-3:]
    assert not [t for t in threading.enumerate() if t.name == "hvd_magics-pack"]
    envs = tmp_path / "cache" / "hvd_magics" / "envs"
    assert [p.name for p in envs.iterdir()] == []  # no half-written part left
    archive = environment_shipping.packed_environment(facts, say)
    assert archive.exists() and said[-1].startswith("packed ")
