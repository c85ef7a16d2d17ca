"""Rank planning: contiguous local ranks per host, one rendezvous per job; slots checked."""
import time

import pytest

from hvd_magics.task.slots import iface_for_address, plan_ranks, slot_env


def test_ranks_on_one_host_are_contiguous_even_when_tasks_interleave():
    slots = plan_ranks(["a", "b", "a", "b"])
    assert [s.hostname for s in slots] == ["a", "b", "a", "b"]
    by_rank = sorted(slots, key=lambda s: s.rank)
    assert [s.hostname for s in by_rank] == ["a", "a", "b", "b"]
    assert [(s.local_rank, s.cross_rank) for s in by_rank] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert {s.size for s in slots} == {4} and {s.local_size for s in slots} == {2}


def test_slot_env_has_what_gloo_reads():
    slot = plan_ranks(["h", "h"])[1]
    env = slot_env(slot, "127.0.0.1", 4321, "lo")
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_LOCAL_RANK"] == "1"
    assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4321" and env["HOROVOD_CONTROLLER"] == "gloo"


def test_loopback_maps_to_lo_and_names_to_nothing():
    assert iface_for_address("127.0.0.1") == "lo"
    assert iface_for_address("not-an-ip") == ""


def test_a_local_master_tells_its_slots_and_others_do_not():
    import os

    from hvd_magics.launch.spark_slots import local_master_slots

    assert local_master_slots("local") == 1 and local_master_slots("local[2]") == 2
    assert local_master_slots("local[*]") == os.cpu_count()
    assert local_master_slots("local[4, 3]") == 4  # N cores, retries
    assert local_master_slots("local-cluster[2, 3, 1024]") == 6
    assert local_master_slots("local[4]", task_cpus=2) == 2
    assert local_master_slots("spark://host:7077") is None
    assert local_master_slots("yarn") is None


def test_the_driver_fallback_is_offered_only_to_jobs_without_dataframes():
    from hvd_magics.launch.spark_slots import not_enough_slots

    plain = str(not_enough_slots(5, 2, 2, "local[2]", "1"))
    assert plain.endswith("Fix: use np<=2, add executors or cores, or use np=-5 to run all ranks "
                          "on the driver.")
    with_data = str(not_enough_slots(5, 2, 2, "local[2]", "1", reads_data=True))
    assert with_data.endswith("Fix: use np<=2, add executors or cores.") and "np=-5" not in \
        with_data


def test_a_failed_rendezvous_request_is_a_log_line_not_a_traceback_in_the_cell(capsys):
    """Seen in the elastic notebook: socketserver printed a rank's reset connection's traceback
    into the cell. Our fixed-size rendezvous (a rank killed while its request is held) and
    Horovod's elastic one (quieted) alike."""
    import socket
    import struct

    from horovod.runner.http.http_server import RendezvousServer as HorovodRendezvous

    from hvd_magics.task.rendezvous import RendezvousServer
    from hvd_magics.task.slots import quiet_request_errors

    plan = plan_ranks(["localhost", "localhost"])
    lines: list[str] = []
    ours = RendezvousServer(plan, lines.append)
    horovods = HorovodRendezvous(verbose=0)
    horovods.start()
    try:
        quiet_request_errors(horovods, lines.append)
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError:
            horovods._httpd.handle_error(None, ("10.0.0.7", 4242))
        rank = socket.create_connection(("127.0.0.1", ours.port))
        rank.sendall(b"GET /global/0 HTTP/1.0\r\n\r\n")  # held: the key is not there
        rank.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rank.close()  # reset, as a killed rank's kernel does
        deadline = time.monotonic() + 5
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lines[0] == ("rendezvous request from ('10.0.0.7', 4242) failed: "
                            "ConnectionResetError: reset by peer")
        assert lines[1].startswith("rendezvous request from ('127.0.0.1', ")
        assert lines[1].endswith("failed: ConnectionResetError: [Errno 104] Connection reset "
                                 "by peer"), lines
        assert capsys.readouterr().err == ""
    finally:
        ours.stop()
        horovods.stop()


def test_no_smaller_np_is_offered_when_no_slot_is_free():
    from hvd_magics.launch.spark_slots import not_enough_slots

    text = str(not_enough_slots(1, 0, 2, "local[2]", "1", held=2))
    assert "Fix: add executors or cores, or use np=-1" in text and "np<=0" not in text
    assert "warm pools and background jobs hold 2 of the slots" in text


def test_the_plan_is_horovods_own_for_any_layout_of_tasks_on_hosts():
    """The task plans ranks without Horovod (an executor given the shipped environment may
    have none); the plan must stay Horovod's, which its rendezvous and elastic driver expect."""
    import random

    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    def horovods(task_hosts):
        order = list(dict.fromkeys(task_hosts))
        slots = get_host_assignments([HostInfo(h, task_hosts.count(h)) for h in order],
                                     len(task_hosts))
        by_host = {h: [s for s in slots if s.hostname == h] for h in order}
        return [by_host[h].pop(0) for h in task_hosts]

    chance = random.Random(7)
    for _ in range(500):
        hosts = [chance.choice("abcd") for _ in range(chance.randint(1, 9))]
        ours, theirs = plan_ranks(hosts), horovods(hosts)
        assert [vars(s) for s in theirs] == [vars(s) for s in ours], hosts
        assert [s.to_response_string() for s in theirs] == [s.to_response_string() for s in ours]


def _asker(port):
    import urllib.error
    import urllib.request

    def ask(method, path, data=None):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""
    return ask


def test_the_rendezvous_stores_answers_and_clears_a_scope_once_every_rank_left_it(monkeypatch):
    from hvd_magics.task import rendezvous
    from hvd_magics.task.slots import start_rendezvous, stop_rendezvous

    monkeypatch.setattr(rendezvous, "HOLD_S", 0.2)
    server, port = start_rendezvous(plan_ranks(["a", "a"]))
    ask = _asker(port)
    try:
        began = time.monotonic()
        assert ask("GET", "/global/rank0") == (404, b"")  # not there yet: held, then 404
        assert time.monotonic() - began >= 0.2
        assert ask("PUT", "/global/rank0", b"addr0")[0] == 200
        assert ask("GET", "/global/rank0") == (200, b"addr0")
        assert ask("DELETE", "/global/0")[0] == 200
        assert ask("GET", "/global/rank0") == (200, b"addr0")  # one of two left the scope
        assert ask("PUT", "/local_a/0", b"l0")[0] == 200 and ask("DELETE", "/local_a/0")[0] == 200
        assert ask("DELETE", "/global/1")[0] == 200
        assert ask("GET", "/global/rank0") == (404, b"")  # both: cleared
        # the global scope's end left the local scope's count alone: cleared after its second
        assert ask("GET", "/local_a/0") == (200, b"l0")
        assert ask("DELETE", "/local_a/1")[0] == 200 and ask("GET", "/local_a/0")[0] == 404
        assert ask("PUT", "/adhoc/k", b"v")[0] == 200 and ask("DELETE", "/adhoc/k")[0] == 200
        assert ask("GET", "/adhoc/k")[0] == 404
        assert ask("GET", "/too/many/parts")[0] == 400
        assert ask("POST", "/global/x", b"")[0] == 405
    finally:
        stop_rendezvous(server)


def test_sixty_four_ranks_meet_asking_once_per_key_not_a_hundred_times_a_second():
    """Gloo's full mesh at 64 ranks, as Horovod's store asks it (a fresh connection per
    request): each rank puts its key, then waits for every other's. A missing key's ``GET`` is
    held until the key arrives, so a rank that waits asks once, however late its peer (64
    ranks polling every 10 ms for a late rank 0 sent 6,300 requests a second, and timed out)."""
    import threading

    from hvd_magics.task.rendezvous import RendezvousServer

    size = 64
    server = RendezvousServer(plan_ranks(["h"] * size))
    ask = _asker(server.port)
    asked = [0] * size
    got: list[dict] = [{} for _ in range(size)]

    def rank(me):
        if me == 0:
            time.sleep(0.5)  # the late rank
        assert ask("PUT", f"/global/{me}", f"address {me}".encode())[0] == 200
        for peer in range(size):
            if peer != me:
                status, value = ask("GET", f"/global/{peer}")
                asked[me] += 1
                while status == 404:  # Horovod asks again after a 404
                    status, value = ask("GET", f"/global/{peer}")
                    asked[me] += 1
                got[me][peer] = value

    threads = [threading.Thread(target=rank, args=(me,)) for me in range(size)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert all(got[me] == {p: f"address {p}".encode() for p in range(size) if p != me}
                   for me in range(size))
        assert asked == [size - 1] * size  # once per peer: the wait for rank 0 held, no 404
    finally:
        server.stop()


class _EndingJobContext:
    """A local[2] SparkContext whose status tracker counts one task of a job that just ended
    for its first ``busy_reads`` reads (Spark's listener bus is asynchronous)."""

    master = "local[2]"

    def __init__(self, busy_reads: int) -> None:
        self.busy_reads, self.reads = busy_reads, 0
        context = self

        class _Scala:
            def maxNumConcurrentTasks(self, _profile):  # noqa: N802 - Spark's name
                return 2

            def resourceProfileManager(self):  # noqa: N802
                return type("Manager", (), {"defaultResourceProfile": lambda _self: None})()

        class _Tracker:
            def getActiveStageIds(self):  # noqa: N802
                context.reads += 1
                return [7] if context.reads <= context.busy_reads else []

            def getStageInfo(self, _stage):  # noqa: N802
                return type("Info", (), {"numActiveTasks": 1})()

        self._jsc = type("Jsc", (), {"sc": lambda _self: _Scala()})()
        self._tracker = _Tracker()

    def statusTracker(self):  # noqa: N802
        return self._tracker

    def getConf(self):  # noqa: N802
        return {"spark.task.cpus": "1"}


def test_on_a_local_master_a_job_just_ended_is_waited_for_and_a_job_too_large_is_not():
    """A cell right after another was refused ('np=2 needs 2 free Spark task slots ... 1 free
    of 2'): Spark still counted the ended job's task for a moment."""
    from hvd_magics.errors import NotEnoughSlotsError
    from hvd_magics.launch.spark_slots import check_slots

    ending = _EndingJobContext(busy_reads=3)
    check_slots(ending, 2)
    assert ending.reads == 4
    too_large = _EndingJobContext(busy_reads=0)
    with pytest.raises(NotEnoughSlotsError, match="np=3 needs 3 free Spark task slots"):
        check_slots(too_large, 3)
    assert too_large.reads == 1  # refused at once: a local master never grows


class _RegisteringContext:
    """A SparkContext of ``master`` whose executors register one slot a read, from ``first``
    slots up to ``last`` (a ``local-cluster`` whose second worker is still starting)."""

    def __init__(self, master: str, first: int, last: int, conf: dict | None = None) -> None:
        self.master, self.reads, self.slots = master, 0, first
        self.conf = {"spark.task.cpus": "1", **(conf or {})}
        context = self

        class _Scala:
            def maxNumConcurrentTasks(self, _profile):  # noqa: N802 - Spark's name
                context.reads += 1
                context.slots = min(first + context.reads // 4, last)
                return context.slots

            def resourceProfileManager(self):  # noqa: N802
                return type("Manager", (), {"defaultResourceProfile": lambda _self: None})()

        self._jsc = type("Jsc", (), {"sc": lambda _self: _Scala()})()
        self._tracker = type("Tracker", (), {"getActiveStageIds": lambda _self: []})()

    def statusTracker(self):  # noqa: N802
        return self._tracker

    def getConf(self):  # noqa: N802
        return self.conf


def test_a_cluster_whose_promised_executors_still_register_is_waited_for():
    """Issue 82, item 3: pyspark's DeepSpeed test class (local-cluster[2,2,512],
    spark.task.cpus=2): the first np=2 job was refused with '1 free of 1' while the second
    worker registered; pyspark's waits. The wait lasts past the few seconds a cluster gets
    (wait_s) while the master or the settings promise more slots, up to the start timeout."""
    from hvd_magics.launch.spark_slots import check_slots

    cluster = _RegisteringContext("local-cluster[2,2,512]", 1, 2,
                                  {"spark.task.cpus": "2"})
    check_slots(cluster, 2, wait_s=0.0, gone_wait_s=30)
    assert cluster.slots == 2
    promised = _RegisteringContext("spark://master:7077", 1, 2,
                                   {"spark.executor.instances": "2", "spark.executor.cores": "1"})
    check_slots(promised, 2, wait_s=0.0, gone_wait_s=30)
    assert promised.slots == 2


def test_a_cluster_that_will_not_have_the_slots_is_refused_without_the_long_wait():
    from hvd_magics.errors import NotEnoughSlotsError
    from hvd_magics.launch.spark_slots import check_slots, slots_to_come

    whole = _RegisteringContext("local-cluster[2,1,512]", 2, 2)
    assert slots_to_come(whole, 2, 3) is None  # 2 slots promised, 3 needed: waiting is no use
    began = time.monotonic()
    with pytest.raises(NotEnoughSlotsError, match="np=3 needs 3 free Spark task slots"):
        check_slots(whole, 3, wait_s=0.2, gone_wait_s=30)
    assert time.monotonic() - began < 5
    registering = _RegisteringContext("local-cluster[2,1,512]", 1, 2)
    assert slots_to_come(registering, 1, 2) == ("the local cluster's workers are registering "
                                                "(1 of 2 task slots so far;")
