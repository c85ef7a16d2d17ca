"""Trace files: repair of broken ones, and summaries of large ones in bounded memory."""
import json
import tracemalloc

from hvd_magics.job.timeline import CHUNK_BYTES, repair, summarize


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
    tracemalloc.start()
    summary = summarize(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert summary.activity_count["ALLREDUCE"] == 100_000
    assert summary.activity_us["GLOO_ALLREDUCE"] == 100_000 * 10
    assert summary.tensor_us["grad_1"] == 2000 * (5 + 14)  # negotiate + allreduce spans
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
