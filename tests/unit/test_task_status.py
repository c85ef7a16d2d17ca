"""The status row a Spark task returns (no Spark: the batch is built and read back here)."""
import json
import subprocess
import sys

from hvd_magics.task.task_entry import status_batch


def test_the_status_batch_holds_the_line_as_one_string_row():
    line = json.dumps({"partition": 1, "error": "naïve ✓"})
    batch = status_batch(line)
    assert batch.schema.names == ["status"] and str(batch.schema.field(0).type) == "string"
    assert batch.to_pylist() == [{"status": line}]


def test_building_the_status_batch_does_not_import_pandas():
    # pyarrow's pa.array and from_pydict import pandas: half a second at the end of every job
    code = ("import sys; from hvd_magics.task.task_entry import status_batch; "
            "status_batch('{}'); assert 'pandas' not in sys.modules, 'pandas imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
