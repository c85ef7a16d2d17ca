"""``python -m hvd_magics.horovod check`` in a process of its own, which imports Horovod and the
frameworks it was built for (seconds: out of the quick tier)."""
import subprocess
import sys
from pathlib import Path

from hvd_magics.horovod import build


def test_check_says_what_the_installed_horovod_was_built_for_or_that_none_was(tmp_path):
    """This environment's Horovod was built by the command (make setup runs it); a Python
    without one is told to build it."""
    here = subprocess.run([sys.executable, "-m", "hvd_magics.horovod", "check"],
                          capture_output=True, text=True)
    assert here.returncode == 0, here.stdout + here.stderr
    assert here.stdout.startswith("Horovod 0.28.1 works here, built for Python ")
    bare = subprocess.run([sys.executable, "-I", "-S", "-c",
                           "import sys; sys.path[:0] = [sys.argv[1]]; "
                           "from hvd_magics.horovod.__main__ import main; sys.exit(main(['check']))",
                           str(Path(build.__file__).parents[2])],
                          capture_output=True, text=True)
    assert bare.returncode == 1
    assert bare.stdout.startswith("No Horovod is installed in ") and \
        "Build one: python -m hvd_magics.horovod build" in bare.stdout, bare
