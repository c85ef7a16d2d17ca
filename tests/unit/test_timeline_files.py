"""Trace files: repair of broken ones, and summaries of large ones in bounded memory."""
import json
import subprocess
import sys

from hvd_magics.job.records.timeline import CHUNK_BYTES, repair, summarize


def _write_trace(path, tensors: int, ops: int) -> None:
    with open(path, "w") as fh:
        fh.write('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {}},\n')
        for t in range(1, tensors + 1):
            fh.write(f'{{"name": "process_name", "ph": "M", "pid": {t}, "args": {{"name": "grad_{t}"}}}},\n')
        ts = 0
        for i in range(ops):
            pid = i % tensors + 1
            fh.write(f'{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": {ts}, "pid": {pid}}},'
                     f'{{"ph": "E", "ts": {ts + 5}, "pid": {pid}}},'
                     f'{{"ph": "B", "name": "ALLREDUCE", "ts": {ts + 6}, "pid": {pid}}},'
                     f'{{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": {ts + 7}, "pid": {pid}}},'
                     f'{{"ph": "E", "ts": {ts + 17}, "pid": {pid}}},{{"ph": "E", "ts": {ts + 20}, "pid": {pid}}},')
            ts += 25
        fh.write('{"ph": "i", "name": "CYCLE_START", "ts": 1, "pid": 0}]')


def test_a_large_trace_is_summarised_in_bounded_memory(tmp_path):
    path = tmp_path / "big.json"
    _write_trace(path, tensors=50, ops=100_000)
    size = path.stat().st_size
    assert size > 20 * CHUNK_BYTES
    # in a process of its own: the growth of its peak resident memory while it summarises (a
    # whole-file json.load of this trace grows it by about 180 MB; tracemalloc took 9 s more)
    code = ("import json, resource, sys\n"
            "from hvd_magics.job.records.timeline import summarize\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "s = summarize(sys.argv[1])\n"
            "grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024\n"
            "print(json.dumps([s.activity_count['ALLREDUCE'], s.activity_us['GLOO_ALLREDUCE'], "
            "s.tensor_us['grad_1'], grew]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=120, check=True)
    allreduces, gloo_us, grad_1_us, peak = json.loads(done.stdout)
    assert allreduces == 100_000
    assert gloo_us == 100_000 * 10
    assert grad_1_us == 2000 * (5 + 14)  # negotiate + allreduce spans
    # a chunk buffer and the spans kept for the picture: a constant, whatever the trace's size
    assert peak < 16e6, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB trace"


def test_repair_keeps_a_valid_trace_and_fixes_cut_ones(tmp_path):
    path = tmp_path / "t.json"
    _write_trace(path, tensors=2, ops=10)
    assert repair(path) is False
    complete = json.loads(path.read_text())
    path.write_text(path.read_text()[:-40])
    assert repair(path) is True
    assert 0 < len(json.loads(path.read_text())) < len(complete)
    (tmp_path / "only.json").write_text("[")
    assert repair(tmp_path / "only.json") is True
    assert json.loads((tmp_path / "only.json").read_text()) == []


def _segment(start_us: int, tensor: str, ts: int) -> str:
    return ('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": '
            f'{{"start_time_since_epoch_in_micros":{start_us}}}}},\n'
            f'{{"name": "process_name", "ph": "M", "pid": 1, "args": {{"name": "{tensor}"}}}},\n'
            f'{{"ph": "B", "name": "ALLREDUCE", "ts": {ts}, "pid": 1}},'
            f'{{"ph": "E", "ts": {ts + 10}, "pid": 1}}]')


def test_an_elastic_jobs_restarted_trace_becomes_one_array_on_one_clock(tmp_path):
    """Rank 0 of an elastic job starts its trace again at a reset: '...][...' in one file."""
    path = tmp_path / "elastic.json"
    path.write_text(_segment(1_000_000, "allreduce.weight", 5)
                    + _segment(3_000_000, "allreduce.weight", 7)[:-1])  # cut: the job went on
    assert repair(path) is True
    events = json.loads(path.read_text())
    begins = [e for e in events if e.get("ph") == "B"]
    assert [(e["ts"], e["pid"]) for e in begins] == [(5, 1), (2_000_007, 3)]
    names = {e["pid"]: e["args"].get("name") for e in events if e.get("name") == "process_name"}
    assert names == {0: None, 1: "allreduce.weight", 2: None, 3: "allreduce.weight"}
    assert repair(path) is False  # now whole
    summary = summarize(path)
    assert summary.activity_count["ALLREDUCE"] == 2 and summary.tensor_us["allreduce.weight"] == 20
