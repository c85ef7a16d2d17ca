"""scripts/setup.sh says clearly what is missing and how to get it (nothing is installed here)."""
import os
import shutil
import subprocess

from tests.conftest import ROOT


def _run_setup(tmp_path, keep: list[str]) -> subprocess.CompletedProcess:
    """Run the set-up with a PATH that holds only the named tools, forcing the checks to run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ["bash", "sed", "head", "cat", "sha256sum", "cut", "id", "dirname", "rm", *keep]:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "HVD_MAGICS_NO_APT": "1",
           "HVD_MAGICS_FORCE_SETUP": "1", "HVD_MAGICS_VENV": str(tmp_path / "venv")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env,
                          capture_output=True, text=True, timeout=60)


def test_no_java_names_the_version_and_the_install_command(tmp_path):
    proc = _run_setup(tmp_path, keep=["python3"])
    assert proc.returncode == 1
    assert "Spark 4 needs Java 17 or newer, found: no java on PATH" in proc.stderr
    assert "apt-get install openjdk-17-jre-headless" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_no_compiler_names_build_essential(tmp_path):
    proc = _run_setup(tmp_path, keep=["python3", "java"])
    assert proc.returncode == 1
    assert "building Horovod needs gcc, g++ and make" in proc.stderr
    assert "apt-get install build-essential" in proc.stderr


def test_a_second_setup_is_a_quick_no_op():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HVD_MAGICS_NO_APT": "1"})
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
