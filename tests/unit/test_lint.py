"""The package as a maintained one: ruff and mypy, configured in pyproject.toml, find nothing
in hvd_magics/ (the fast tier runs them; mypy reads the frameworks as Any, in seconds)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ruff_finds_nothing_in_the_package():
    out = _run("ruff", "check", "--no-cache", "hvd_magics")
    assert out.returncode == 0, out.stdout + out.stderr


#: mypy's cache, outside the repository: 0.2 s a check after the first (4.3 s without one)
MYPY_CACHE = Path.home() / ".cache" / "hvd_magics-mypy"


def test_mypy_finds_nothing_in_the_package():
    out = _run("mypy", "--cache-dir", str(MYPY_CACHE))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("Success: no issues found"), out.stdout
