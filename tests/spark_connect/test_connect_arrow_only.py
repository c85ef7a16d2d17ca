"""A Spark Connect server whose Python workers have pyarrow and numpy and nothing else (issue
39): no framework, no Horovod, no hvd_magics. The notebook ships its environment through the
session's artifacts and every engine runs in it. Its own module: a local Connect server takes
the default port, so this one starts after the others have stopped."""
import pytest

from tests.environments import arrow_only_python
from tests.spark_connect.test_connect import ConnectWorker, _ran


@pytest.fixture(scope="module")
def arrow_only_connect(tmp_path_factory):
    python = arrow_only_python(tmp_path_factory.mktemp("arrow-only"))
    worker = ConnectWorker(tmp_path_factory.mktemp("arrow-only-connect"), python)
    yield worker
    worker.close()


def test_workers_with_only_arrow_run_every_engine_in_the_shipped_environment(
        arrow_only_connect, tmp_path):
    out = _ran(arrow_only_connect.run("shipped_to_bare_workers", tmp_path))
    for engine in ("torch", "horovod", "tf"):
        assert f"shipped {engine} True True 2.0" in out, out
