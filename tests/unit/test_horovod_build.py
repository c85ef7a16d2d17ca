"""``python -m hvd_magics.horovod build``: what it builds for, what it says is missing, and the
hint a job without Horovod gets (the build itself runs in scripts/setup.sh and in
benchmarks/install.py)."""
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_magics.errors import HOROVOD_BUILD_COMMAND, RankFailure
from hvd_magics.horovod import build, patches
from hvd_magics.job.verdicts.failure_hints import hint_for


def test_a_build_is_keyed_on_python_frameworks_and_gpu_operations():
    both = build.Target("3.11.7", {"tensorflow": "2.21.0", "torch": "2.13.0"})
    assert both.key() == build.Target("3.11.7", {"torch": "2.13.0",
                                                 "tensorflow": "2.21.0"}).key()
    others = [build.Target("3.11.7", {"torch": "2.13.0"}),
              build.Target("3.12.1", both.frameworks),
              build.Target("3.11.7", {"tensorflow": "2.21.0", "torch": "2.14.1"}),
              build.Target("3.11.7", both.frameworks, "NCCL")]
    assert len({both.key(), *(t.key() for t in others)}) == 5
    assert both.describe() == "Python 3.11.7, tensorflow 2.21.0, torch 2.13.0, CPU (Gloo)"
    assert others[3].describe().endswith("GPU (NCCL and Gloo)")


def test_an_environment_without_a_framework_is_told_to_install_one(monkeypatch):
    monkeypatch.setattr(build, "framework_versions", lambda: {})
    with pytest.raises(build.BuildError, match="neither PyTorch nor TensorFlow.*pip install torch"):
        build.target()


def test_this_environments_frameworks_are_found_without_importing_them():
    code = ("import sys; from hvd_magics.horovod.build import framework_versions as f; "
            "print(sorted(f())); print('torch' in sys.modules, 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[:2] == ["['tensorflow', 'torch']", "False False"]


def _bin_with(tmp_path: Path, tools: dict[str, str]) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, script in tools.items():
        (folder / name).write_text(f"#!/bin/sh\n{script}\n")
        (folder / name).chmod(0o755)
    return folder


def test_missing_tools_name_the_debian_and_conda_packages(tmp_path, monkeypatch):
    folder = _bin_with(tmp_path, {"make": "true"})
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(sys, "executable", str(folder / "python"))
    lines = build.missing_tools()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gcc, g++, cmake not found")
    assert "apt-get install build-essential cmake" in lines[0]
    assert "conda install -c conda-forge cxx-compiler make 'cmake<4'" in lines[0]
    assert "pip install 'cmake<4'" in lines[0]


def test_cmake_4_is_refused_with_the_fix(tmp_path, monkeypatch):
    folder = _bin_with(tmp_path, {"gcc": "true", "g++": "true", "make": "true",
                                  "cmake": "echo 'cmake version 4.0.2'"})
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(sys, "executable", str(folder / "python"))
    assert build.missing_tools() == [
        f"{folder}/cmake is CMake 4.0.2, which refuses Horovod's vendored Gloo. Fix: pip install "
        "'cmake<4' into this environment"]


def test_a_failed_build_shows_the_lines_that_say_why():
    log = "\n".join(["  [ 98%] Building CXX object x.o", "  warning: unused",
                     "  /usr/bin/ld: libgloo.a: multiple definition of `kDefaultTimeout'",
                     "  collect2: error: ld returned 1 exit status",
                     "  error: subprocess-exited-with-error", "  note: not a problem with pip"])
    assert build.failure_lines(log) == [
        "/usr/bin/ld: libgloo.a: multiple definition of `kDefaultTimeout'",
        "collect2: error: ld returned 1 exit status"]
    assert build.failure_lines("a\nb") == ["a", "b"]  # nothing recognised: the last lines


def test_patches_apply_once_and_refuse_another_version(tmp_path):
    files: dict[str, str] = {}
    for rel, old, _ in patches.CHANGES:
        files[rel] = files.get(rel, "") + f"\n// before\n{old}\n// after\n"
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert sorted(set(patches.apply(tmp_path))) == sorted(files)
    assert patches.apply(tmp_path) == []  # already made: nothing twice
    (tmp_path / patches.CHANGES[0][0]).write_text("another version\n")
    with pytest.raises(patches.PatchError, match="for Horovod 0.28.1's source"):
        patches.apply(tmp_path)


def test_a_job_without_horovod_is_told_the_build_command_and_the_torch_engine():
    failure = RankFailure(rank=0, host="h", exit_code=1, error="ModuleNotFoundError",
                          message="No module named 'horovod'")
    hint = hint_for(failure)
    assert HOROVOD_BUILD_COMMAND in hint and "--engine torch" in hint
    gpu = RankFailure(rank=1, host="h", exit_code=1, error="RuntimeError",
                      message="CUDA error: invalid device ordinal")
    assert "at most one rank per GPU" in hint_for(gpu)
    assert hint_for(RankFailure(rank=0, host="h", exit_code=1, error="ValueError",
                                message="No module named 'horovodx'")) == ""


def test_a_rank_aborted_by_glooes_start_timeout_says_the_exception_and_the_fix():
    """Seen at 64 ranks (issue 85): a rank ended by signal 6, its output the C++ runtime's
    words. The failure reads them (the type and ``what()``, Gloo's source places dropped) and
    says what happened and the fix, in our words."""
    from hvd_magics.job.rank_state import RankState, native_exception

    said = ["terminate called after throwing an instance of 'gloo::IoException'",
            "  what():  [/tmp/h/horovod/common/gloo/http_store.cc:54] [/tmp/h/horovod/common/"
            "gloo/http_store.cc:54] Wait timeout after 30 seconds for key(s): 0. You may want "
            "to increase the timeout via HOROVOD_GLOO_TIMEOUT_SECONDS"]
    assert native_exception(["some output", *said]) == {
        "error": "gloo::IoException",
        "message": "Wait timeout after 30 seconds for key(s): 0. You may want to increase the "
                   "timeout via HOROVOD_GLOO_TIMEOUT_SECONDS"}
    assert native_exception(["killed"]) == {}
    rank = RankState(55)
    rank.host, rank.exit_code = "10.77.0.2", -6
    rank.tail.extend(["loading data", *said])
    failure = rank.failure()
    assert failure.output_tail == ["loading data"]  # the runtime's words are said once: above
    assert failure.headline() == (
        "rank 55 on 10.77.0.2: gloo::IoException: Wait timeout after 30 seconds for key(s): 0. "
        "You may want to increase the timeout via HOROVOD_GLOO_TIMEOUT_SECONDS")
    assert failure.cause.name == "DIED"  # a death, for the failure policy, as before
    hint = hint_for(failure)
    assert "Horovod's start timed out" in hint and "the one that waited" in hint
    assert "--env HOROVOD_GLOO_TIMEOUT_SECONDS=120" in hint
