"""A thread's time on a CPU read at the scale of a short step (issue 82, item 1): schedstat's
first field is brought up to date only at the scheduler's ticks and switches, so 1 ms of spin
between two reads read a median of 0.005 ms, and ranks of 1 ms steps were said to be "mostly
off the CPU (sleeping, reading files...)" while they computed."""
import threading
import time

from hvd_magics.thread_cpu import ThreadCpu


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _work(count: int) -> int:
    """Arithmetic, no clock read (reading the thread's clock brings schedstat up to date)."""
    total = 0
    for i in range(count):
        total += i * i
    return total


def test_a_millisecond_on_a_cpu_reads_as_one():
    count, took = 1000, 0.0
    while took < 0.001:  # as much work as takes about a millisecond of CPU
        count *= 2
        before = time.thread_time()
        _work(count)
        took = time.thread_time() - before
    cpu = ThreadCpu()
    assert cpu.readable
    readings, reference = [], []
    for _ in range(50):
        before = cpu.seconds()[0]
        _work(count)
        readings.append(cpu.seconds()[0] - before)
        start = time.thread_time()
        _work(count)
        reference.append(time.thread_time() - start)
    cpu.close()
    readings.sort()
    reference.sort()
    assert readings[25] >= 0.7 * reference[25], (readings, reference)


def test_another_thread_reads_the_thread_that_made_it():
    made: list[ThreadCpu] = []
    ready, done = threading.Event(), threading.Event()

    def work() -> None:
        made.append(ThreadCpu())
        ready.set()
        _spin(0.05)
        done.wait(10)

    thread = threading.Thread(target=work)
    thread.start()
    ready.wait(10)
    first = made[0].seconds()[0]
    while thread.is_alive() and made[0].seconds()[0] - first < 0.04:
        pass  # the worker spins; this thread reads its clock, not its own
    seen = made[0].seconds()[0] - first
    done.set()
    thread.join()
    assert seen >= 0.04, seen
