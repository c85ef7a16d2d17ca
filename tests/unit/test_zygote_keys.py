"""Which ranks may share a zygote (hvd_magics.task.zygotes): only ranks whose environments
differ in what a framework reads once the job runs."""
import os

from hvd_magics.common.zygote_place import socket_path, starting, take_lock, zygote_dir
from hvd_magics.task.zygotes import frameworks, key_of


def test_ranks_differing_only_in_their_own_place_share_a_zygote():
    base = {"PATH": "/usr/bin", "TF_USE_LEGACY_KERAS": "1", "PYTHONPATH": "/pkg"}
    rank0 = {**base, "HOROVOD_RANK": "0", "HVD_MAGICS_RANK": "0", "RANK": "0",
             "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": "0", "TF_CONFIG": "{}"}
    rank1 = {**base, "HOROVOD_RANK": "1", "HVD_MAGICS_RANK": "1", "RANK": "1",
             "MASTER_PORT": "1234", "CUDA_VISIBLE_DEVICES": "1", "TF_CONFIG": "{...}"}
    assert key_of("/venv/bin/python", rank0) == key_of("/venv/bin/python", rank1)


def test_anything_a_framework_may_read_on_import_gets_a_zygote_of_its_own():
    base = {"PATH": "/usr/bin", "TF_USE_LEGACY_KERAS": "1"}
    key = key_of("/venv/bin/python", base)
    assert key_of("/venv/bin/python", {**base, "TF_USE_LEGACY_KERAS": "0"}) != key
    assert key_of("/venv/bin/python", {**base, "OMP_NUM_THREADS": "1"}) != key
    assert key_of("/venv/bin/python", {**base, "KERAS_BACKEND": "torch"}) != key
    assert key_of("/shipped/bin/python", base) != key


def test_ranks_of_two_spark_applications_and_kernels_share_a_zygote():
    """Spark's per-application variables (its folders, its worker secret), a kernel's and the
    temporary folder are read by nothing on import: one zygote serves them all."""
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/pkg"}
    first = {**base, "SPARK_LOCAL_DIRS": "/tmp/blockmgr-1", "PYTHON_WORKER_FACTORY_SECRET": "a",
             "JPY_PARENT_PID": "10", "TMPDIR": "/tmp/lane0", "COLUMNS": "80",
             "_MLFLOW_TELEMETRY_SESSION_ID": "1f"}  # set by importing mlflow: one per process
    second = {**base, "SPARK_LOCAL_DIRS": "/tmp/blockmgr-2", "PYTHON_WORKER_FACTORY_SECRET": "b",
              "JPY_PARENT_PID": "11", "TMPDIR": "/tmp/lane1"}
    assert key_of("/venv/bin/python", first) == key_of("/venv/bin/python", second)


def test_zygote_sockets_live_only_in_a_folder_closed_to_other_users(tmp_path):
    """A zygote forks processes for whoever reaches its socket: a folder others may open (or a
    link to one) is not used, and ranks start fresh."""
    mine = tmp_path / "mine"
    assert zygote_dir({"HVD_MAGICS_ZYGOTE_DIR": str(mine)}) == str(mine)
    assert mine.stat().st_mode & 0o777 == 0o700
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o755)
    opened.chmod(0o755)
    assert zygote_dir({"HVD_MAGICS_ZYGOTE_DIR": str(opened)}) is None
    (tmp_path / "link").symlink_to(mine)
    assert zygote_dir({"HVD_MAGICS_ZYGOTE_DIR": str(tmp_path / "link")}) is None
    path = socket_path("/tmp/z", ("key",))
    assert path is not None and path.startswith("/tmp/z/") and path != socket_path("/tmp/z", 1)
    assert socket_path("/" + "d" * 90, ("key",)) is None  # too long for a Unix socket


def test_one_process_at_a_time_starts_a_zygote_at_a_path(tmp_path):
    path = str(tmp_path / "z.sock")
    assert not starting(path)  # never started: no lock file
    first = take_lock(path)
    assert first is not None and take_lock(path) is None
    assert starting(path)  # and the look leaves the lock to its holder
    assert starting(path) and take_lock(path) is None
    os.close(first)
    assert not starting(path)
    again = take_lock(path)
    assert again is not None
    os.close(again)


def test_a_zygote_imports_only_frameworks_never_the_users_modules():
    assert frameworks(["torch", "horovod.torch", "my_model", "os", "", "tensorflow"], "torch") == {
        "torch", "horovod.torch", "tensorflow"}


def test_a_zygote_holds_at_most_one_of_horovods_bindings():
    """A rank forked from a zygote holding horovod.torch and horovod.tensorflow made collectives
    its fresh peer did not (the second binding's calls went to the first one's Horovod)."""
    from hvd_magics.task.zygotes import binding_of

    both = ["torch", "horovod.torch", "tensorflow", "horovod.tensorflow.keras"]
    assert binding_of(["torch", "horovod.torch"]) == "torch"
    assert binding_of(["horovod.tensorflow.keras", "tensorflow"]) == "tensorflow"
    assert binding_of(both) == binding_of(["torch"]) == ""
    assert frameworks(both, "torch") == {"torch", "horovod.torch", "tensorflow"}
    assert frameworks(both, "tensorflow") == {"torch", "tensorflow", "horovod.tensorflow.keras"}
    assert frameworks(both, "") == {"torch", "tensorflow"}
    python, env = "/venv/bin/python", {"PATH": "/usr/bin"}
    assert key_of(python, env, ["horovod.torch"]) != key_of(python, env, ["horovod.tensorflow"])


def test_executors_that_received_the_same_package_zip_share_its_copy_and_a_zygote(tmp_path,
                                                                                  monkeypatch):
    """Each executor (and each application) keeps the travelled zip in a folder of its own; its
    ranks import it from the host's copy named by its content, so their environments (and
    zygote) are one, and none imports from a folder that goes with its application."""
    import hvd_magics.task.supervisor as supervisor
    from hvd_magics.task import zygotes

    folder = tmp_path / "zygotes"
    env = {"HVD_MAGICS_ZYGOTE_DIR": str(folder), "PATH": "/usr/bin"}
    zips = []
    for executor, content in (("app-1/0", b"one"), ("app-1/1", b"one"), ("app-2/0", b"two")):
        (tmp_path / executor).mkdir(parents=True)
        zips.append(tmp_path / executor / "hvd_magics-0.1.0-0123456789abcdef.zip")
        zips[-1].write_bytes(content)
    copies = [zygotes.package_copy(str(path), env) for path in zips]
    assert copies[0] == copies[1] != copies[2]
    assert [open(copy, "rb").read() for copy in copies] == [b"one", b"one", b"two"]
    assert os.path.dirname(copies[0]) == str(folder / "packages")
    assert os.stat(folder / "packages").st_mode & 0o077 == 0
    assert zygotes.package_copy(str(zips[0]), {**env, "HVD_MAGICS_ZYGOTE": "0"}) == str(zips[0])
    folder.chmod(0o755)  # a folder others may open: no copy, and no zygote either
    assert zygotes.package_copy(str(zips[0]), env) == str(zips[0])
    folder.chmod(0o700)
    # the rank's PYTHONPATH leads with the copy; two executors' ranks get one zygote key
    keys = []
    for path in zips[:2]:
        monkeypatch.setattr(supervisor, "_package_root", lambda path=path: str(path))
        rank_env = supervisor.rank_environment({**env, "PYTHONPATH": "/spark/python"}, {})
        assert rank_env["PYTHONPATH"] == os.pathsep.join((copies[0], "/spark/python"))
        keys.append(zygotes.key_of("/venv/bin/python", rank_env))
    assert keys[0] == keys[1]


def test_a_zygote_whose_imports_load_cuda_never_serves_and_none_starts_there_again(tmp_path):
    """Each job's end started another zygote that imported its frameworks for seconds and then
    found CUDA loaded; the next job's ranks waited for it to serve, in vain."""
    import subprocess
    import sys

    from hvd_magics.common.zygote_place import cuda_mark
    from hvd_magics.task.zygotes import start_zygote

    path = str(tmp_path / "z.sock")
    lock = take_lock(path)
    code = ("import sys; from hvd_magics.rank import zygote; zygote.cuda_loaded = lambda: True; "
            f"zygote.begin({path!r}, [], 60.0, '', {lock})")
    done = subprocess.run([sys.executable, "-c", code], pass_fds=(lock,), timeout=60)
    os.close(lock)
    assert done.returncode == 0 and not os.path.exists(path)  # it never served
    assert os.path.exists(cuda_mark(path)) and not starting(path)
    assert start_zygote(path, sys.executable, dict(os.environ), frozenset({"numpy"})) is None
    free = take_lock(path)
    assert free is not None  # none was started: its lock is free
    os.close(free)


def test_a_zygote_imports_what_its_frameworks_import_lazily_and_looks_at_it_once_for_pools():
    """A zygote importing numpy also imports numpy.random (every rank's fresh seeding imports
    it), and a warm pool's rank forked from it finds the zygote's modules already looked at."""
    import subprocess
    import sys

    code = ("import sys\nfrom hvd_magics.rank import pool_loop, zygote\n"
            "zygote.import_frameworks(['numpy'])\n"
            "print('numpy.random' in sys.modules, 'numpy' in pool_loop._MODULES.seen)")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert said.stdout.split() == ["True", "True"], said.stderr[-2000:]


def test_ranks_in_a_yarn_container_start_fresh_unless_zygotes_are_asked_for(monkeypatch):
    """A forked rank is no descendant of its YARN container (whose memory check and kill go by
    the process tree): off there by default; HVD_MAGICS_ZYGOTE decides when it is set."""
    from hvd_magics.task.zygotes import enabled

    monkeypatch.delenv("HVD_MAGICS_ZYGOTE", raising=False)
    monkeypatch.delenv("CONTAINER_ID", raising=False)
    assert enabled({})
    monkeypatch.setenv("CONTAINER_ID", "container_1764201600000_0001_01_000002")
    assert not enabled({})
    assert enabled({"HVD_MAGICS_ZYGOTE": "1"})
    monkeypatch.setenv("HVD_MAGICS_ZYGOTE", "1")
    assert enabled({}) and not enabled({"HVD_MAGICS_ZYGOTE": "0"})


def test_a_zygote_still_importing_is_waited_for_and_one_gone_still_is_not(tmp_path, monkeypatch):
    """16 zygotes importing PyTorch on 2 cores took longer than a rank's 20 s wait; the ranks
    then started fresh, four imports on every host instead of one, and ran the machine out of
    memory (issue 85). A rank now waits on while the zygote's imports use CPU, and not once
    they stopped moving (hung)."""
    import subprocess
    import sys
    import time

    from hvd_magics.common.zygote_place import starter_cpu
    from hvd_magics.task import zygotes

    monkeypatch.setattr(zygotes, "STARTING_STILL_S", 0.5)
    path = str(tmp_path / "z.sock")
    assert starter_cpu(path) is None  # no lock file
    lock = take_lock(path)
    assert lock is not None and starter_cpu(path) is None  # no zygote named in it yet
    importing = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        f"fd = os.open({path + '.lock'!r}, os.O_RDWR)\n"
        "os.ftruncate(fd, 0); os.pwrite(fd, str(os.getpid()).encode(), 0)\n"
        "end = time.monotonic() + 1.5\n"
        "while time.monotonic() < end: pass\n"  # imports: CPU
        "sys.stdout.write('still\\n'); sys.stdout.flush(); time.sleep(60)\n")],  # hung
        stdout=subprocess.PIPE, text=True)
    try:
        while starter_cpu(path) is None:
            time.sleep(0.01)
        progress = zygotes._Progress(path, time.monotonic())
        seen = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            seen.append(progress.moving(time.monotonic()))
            time.sleep(0.1)
        assert all(seen), seen  # its CPU grew: waited for
        assert importing.stdout.readline() == "still\n"
        while progress.moving(time.monotonic()):  # still for STARTING_STILL_S: hung
            assert time.monotonic() < deadline + 10
            time.sleep(0.05)
        assert starter_cpu(path) is not None  # alive, but no longer moving
    finally:
        importing.kill()
        importing.wait()
        os.close(lock)
    assert starter_cpu(path) is None  # gone
