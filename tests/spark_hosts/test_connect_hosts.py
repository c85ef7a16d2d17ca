"""A Spark Connect server whose executors are real hosts (tests/hosts.py): the client starts a
local Connect server on the hosts' standalone master (``spark.api.mode=connect``), in a process
of its own (tests/spark_hosts/connect_client.py)."""
import json
import subprocess
import sys

from tests.conftest import ROOT, _stop_active


def test_horovod_torch_and_a_dataframe_on_a_connect_server_whose_executors_are_hosts(
        host_cluster):
    _stop_active()  # the tier's classic session holds the hosts' cores
    conf = {**host_cluster.session_conf(), "spark.ui.showConsoleProgress": "false"}
    done = subprocess.run([sys.executable, "-m", "tests.spark_hosts.connect_client",
                           host_cluster.url, json.dumps(conf)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("@@result ")), None)
    assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(line.removeprefix("@@result "))
    assert found["connect"].startswith("pyspark.sql.connect")
    for engine in ("horovod", "torch"):
        views = found[engine]["views"]
        assert [(rank, total) for rank, _host, total in views] == [(r, 4.0) for r in range(4)]
        assert sorted(host for _rank, host, _total in views) == ["host1", "host1", "host2",
                                                                 "host2"]
        assert found[engine]["where"].endswith("(Connect)"), found[engine]["where"]
        assert len(found[engine]["hosts"]) == 2, found[engine]["hosts"]
    _total, rows = found["shard"]
    assert 0 < rows < 400, found["shard"]  # rank 0's part of the 400 rows
