"""A warm pool's event router: each rank's end of a cell becomes the exit a cold job's rank sends."""
import queue

from hvd_magics.job.pool_cell import CellEvents
from hvd_magics.protocol import CELL_END, ERROR, EXIT, OUTPUT, RESULT, STARTED


def _kinds(q: queue.Queue) -> list[tuple]:
    out = []
    while not q.empty():
        e = q.get_nowait()
        out.append((e["kind"], e["rank"]) + ((e["code"],) if e["kind"] == EXIT else ()))
    return out


def test_a_ranks_exit_follows_both_its_result_and_its_end_of_output_in_either_order():
    events, cell = CellEvents(2), queue.Queue()
    events.begin(cell)
    events.put({"kind": STARTED, "rank": 0, "pid": 1})
    events.put({"kind": CELL_END, "rank": 0})  # its output ended before its result arrived
    events.put({"kind": OUTPUT, "rank": 1, "lines": ["x"]})
    assert not events.cell_over
    events.put({"kind": RESULT, "rank": 0, "parts": None})
    events.put({"kind": ERROR, "rank": 1, "error": "ValueError"})
    assert not events.cell_over
    events.put({"kind": CELL_END, "rank": 1})
    assert events.cell_over
    assert _kinds(cell) == [(STARTED, 0), (OUTPUT, 1), (RESULT, 0), (EXIT, 0, 0), (ERROR, 1),
                            (EXIT, 1, 1)]


def test_between_cells_events_wait_apart_and_the_next_cell_starts_clean():
    events, first = CellEvents(1), queue.Queue()
    events.begin(first)
    events.put({"kind": RESULT, "rank": 0, "parts": None})
    events.put({"kind": CELL_END, "rank": 0})
    events.end()
    events.put({"kind": OUTPUT, "rank": 0, "lines": ["late warning"]})
    assert _kinds(first) == [(RESULT, 0), (EXIT, 0, 0)] and events.idle.qsize() == 1
    second = queue.Queue()
    events.begin(second)
    assert not events.cell_over and events.idle.empty()
    events.put({"kind": RESULT, "rank": 0, "parts": None})
    assert not events.cell_over


def test_a_rank_process_that_ends_breaks_the_pool():
    events, cell = CellEvents(2), queue.Queue()
    events.begin(cell)
    events.put({"kind": EXIT, "rank": 1, "code": -9})
    assert events.cell_over and events.exited == {1: -9}
    assert _kinds(cell) == [(EXIT, 1, -9)]
