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
