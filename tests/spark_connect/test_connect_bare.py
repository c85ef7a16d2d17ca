"""A Spark Connect server whose Python workers lack hvd_magics (issue 39): the package travels
to them through the session's artifacts. Its own module: a local Connect server takes the default
port, so this one starts after test_connect's has stopped."""
import pytest

from tests.environments import frameworks_only_python
from tests.spark_connect.test_connect import ConnectWorker, _ran


@pytest.fixture(scope="module")
def bare_connect(tmp_path_factory):
    python = frameworks_only_python(tmp_path_factory.mktemp("frameworks-only"))
    worker = ConnectWorker(tmp_path_factory.mktemp("bare-connect"), python)
    yield worker, python
    worker.close()


def test_a_connect_servers_python_without_hvd_magics_gets_it_with_the_job(bare_connect,
                                                                           tmp_path):
    worker, python = bare_connect
    out = _ran(worker.run("package_travels", tmp_path))
    assert f"ranks run {python} with hvd_magics from" in out, out
    assert ".zip/hvd_magics/__init__.py sum 2.0" in out, out
