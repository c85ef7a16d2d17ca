"""The event channel: authenticated frames are accepted, anything else costs the driver little."""
import contextlib
import queue
import socket
import struct
import threading
import time

import psutil
import pytest

from hvd_magics.channel import (CHANNEL_CLOSED, HELLO_MAX_BYTES, NONCE_BYTES, ChannelAddress,
                               EventClient, EventServer, encode_frame)


def _get(q, timeout=5.0):
    return q.get(timeout=timeout)


def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_signed_events_arrive_in_order_with_rank_and_host():
    server = EventServer("127.0.0.1", "job1")
    client = EventClient(server.address, rank=3, host="hostA")
    for i in range(50):
        client.send({"kind": "output", "lines": [f"line {i}"]})
    got = [_get(server.events) for _ in range(50)]
    assert [e["lines"][0] for e in got] == [f"line {i}" for i in range(50)]
    assert {(e["rank"], e["host"], e["job"]) for e in got} == {(3, "hostA", "job1")}
    client.close()
    closed = _get(server.events)
    assert closed["kind"] == CHANNEL_CLOSED and closed["clean"] is True and closed["rank"] == 3
    server.close()


def test_a_frame_with_a_wrong_signature_is_dropped_with_its_connection():
    server = EventServer("127.0.0.1", "job2")
    sock = socket.create_connection((server.address.host, server.address.port))
    nonce = sock.recv(NONCE_BYTES)
    sock.sendall(encode_frame(b"x" * 32, nonce, 0, {"kind": "hello", "job": "job2", "rank": 0}))
    _wait_for(lambda: server.rejected == 1)
    assert sock.recv(10) == b""  # the server closed it
    assert server.events.empty()  # not even a channel_closed: it never authenticated
    server.close()


def test_a_replayed_hello_does_not_authenticate_another_connection():
    server = EventServer("127.0.0.1", "job2b")
    first = socket.create_connection((server.address.host, server.address.port))
    nonce = first.recv(NONCE_BYTES)
    hello = encode_frame(server.address.secret, nonce, 0, {"kind": "hello", "job": "job2b",
                                                           "rank": 0})
    second = socket.create_connection((server.address.host, server.address.port))
    second.recv(NONCE_BYTES)
    second.sendall(hello)  # valid for the first connection's nonce only
    _wait_for(lambda: server.rejected == 1)
    assert second.recv(10) == b""
    first.close()
    server.close()


def test_events_of_another_job_are_refused():
    server = EventServer("127.0.0.1", "job3")
    other = ChannelAddress(server.address.host, server.address.port, server.address.secret, "job4")
    EventClient(other, rank=0, host="h")
    _wait_for(lambda: server.rejected == 1)
    assert server.events.empty()
    server.close()


def test_closing_the_server_tells_clients():
    server = EventServer("127.0.0.1", "job5")
    closed = queue.Queue()
    EventClient(server.address, 0, "h", on_close=closed.put)
    _wait_for(lambda: server.open_connections == 1)
    server.close()
    assert closed.get(timeout=5) == "the notebook closed the event channel"


def test_a_supervisor_that_vanishes_is_reported_as_an_unclean_close():
    server = EventServer("127.0.0.1", "job6")
    client = EventClient(server.address, 1, "h")
    client.send({"kind": "started", "pid": 1})
    client._sock.close()  # no bye: what a killed executor looks like
    assert _get(server.events)["kind"] == "started"
    closed = _get(server.events)
    assert closed == {**closed, "kind": CHANNEL_CLOSED, "rank": 1, "clean": False}
    server.close()


def test_a_peer_without_the_secret_cannot_grow_the_driver():
    """Regression: a whole line was read before any check (1 GB sent, +1 GB RSS)."""
    server = EventServer("127.0.0.1", "job7")
    proc = psutil.Process()
    before = proc.memory_info().rss
    sock = socket.create_connection((server.address.host, server.address.port))
    sock.recv(NONCE_BYTES)
    sock.sendall(struct.pack(">I32s", HELLO_MAX_BYTES + 1, b"\0" * 32))  # claims a big frame
    sent = 0
    try:
        while sent < 200 * 1024 * 1024:
            sock.sendall(b"A" * (1 << 20))
            sent += 1 << 20
    except OSError:
        pass  # the server hung up on us: that is the point
    _wait_for(lambda: server.rejected == 1)
    grown = proc.memory_info().rss - before
    assert sent < 50 * 1024 * 1024, f"the server read {sent / 2**20:.0f} MiB before hanging up"
    assert grown < 20 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MiB"
    server.close()


def test_silent_connections_are_dropped_after_the_handshake_timeout(monkeypatch):
    import hvd_magics.channel as events

    monkeypatch.setattr(events, "HANDSHAKE_TIMEOUT_S", 0.3)
    server = EventServer("127.0.0.1", "job8")
    sock = socket.create_connection((server.address.host, server.address.port))
    sock.settimeout(5)
    assert len(sock.recv(NONCE_BYTES)) == NONCE_BYTES
    assert sock.recv(10) == b""  # closed by the server when the hello did not come
    server.close()


def test_a_large_frame_from_an_authenticated_client_arrives_whole():
    server = EventServer("127.0.0.1", "job9")
    client = EventClient(server.address, 0, "h")
    blob = "x" * (30 * 1024 * 1024)
    client.send({"kind": "result", "parts": {"value": {"blob": blob}}})
    client.close()
    assert _get(server.events, 30)["parts"]["value"]["blob"] == blob
    server.close()


def test_closed_servers_leave_no_thread_and_accept_nothing():
    """Regression: each job left an accept thread that still accepted connections."""
    before = threading.active_count()
    ports = []
    for i in range(20):
        server = EventServer("127.0.0.1", f"leak{i}")
        client = EventClient(server.address, 0, "h")
        client.send({"kind": "output", "lines": ["x"]})
        client.close()
        _get(server.events)
        server.close()
        ports.append(server.address.port)
    _wait_for(lambda: threading.active_count() <= before)
    for port in ports[:3]:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).recv(1)


def test_the_driver_sends_orders_a_client_verifies_and_a_drop_ends_it_cleanly():
    server = EventServer("127.0.0.1", "job-orders")
    orders, closed = queue.Queue(), threading.Event()
    client = EventClient(server.address, rank=2, host=None, on_close=lambda why: closed.set(),
                         on_order=orders.put)
    assert client.local_address == "127.0.0.1"
    client.send({"kind": "slot_offer", "partition": 2})
    assert _get(server.events)["host"] == "127.0.0.1"  # the address that reaches the driver
    assert server.send_order(2, {"kind": "start_rank", "env": {"A": "1"}})
    assert server.send_order(2, {"kind": "start_rank", "env": {"A": "2"}})
    assert [_get(orders)["env"]["A"] for _ in range(2)] == ["1", "2"]
    assert not server.send_order(7, {"kind": "start_rank"})  # no such task
    server.drop(2)
    assert closed.wait(5)
    event = _get(server.events)
    assert event["kind"] == CHANNEL_CLOSED and event["clean"] is True  # dropped, not lost
    assert not server.send_order(2, {"kind": "start_rank"})
    server.close()


def test_an_order_signed_with_the_wrong_key_is_not_obeyed():
    listener = socket.create_server(("127.0.0.1", 0))
    address = ChannelAddress("127.0.0.1", listener.getsockname()[1], b"k" * 32, "job-forged")
    orders = queue.Queue()
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    nonce = b"n" * NONCE_BYTES

    def serve() -> None:
        _wait_for(lambda: accepted)
        accepted[0].sendall(nonce)
        accepted[0].sendall(encode_frame(b"x" * 32, b"down" + nonce, 0, {"kind": "start_rank"}))

    threading.Thread(target=serve, daemon=True).start()
    reasons: queue.Queue = queue.Queue()
    EventClient(address, rank=0, host="h", on_close=reasons.put, on_order=orders.put)
    # a bad frame ends the connection: the task stops its rank, and says why
    assert reasons.get(timeout=5) == "a frame from the notebook failed its check (bad signature)"
    assert orders.empty()
    listener.close()


class IdleFlood:
    """A local peer that holds ``count`` idle connections to ``address`` from the moment it
    opens, and opens a new one whenever one is closed."""

    def __init__(self, host: str, port: int, count: int = 80) -> None:
        self.address, self.count = (host, port), count
        self.stop = threading.Event()
        self.opened = 0
        self.threads = [threading.Thread(target=self._hold, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _hold(self) -> None:
        while not self.stop.is_set():
            try:
                sock = socket.create_connection(self.address, timeout=1)
            except OSError:
                return
            self.opened += 1
            sock.settimeout(0.2)
            while not self.stop.is_set():
                try:
                    if sock.recv(64) == b"":
                        break  # the server dropped us: come back at once
                except socket.timeout:
                    continue
                except OSError:
                    break
            sock.close()

    def end(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)


def test_idle_connections_cannot_keep_the_ranks_out():
    """40 idle connections held from the start kept every rank out (StartTimeoutError)."""
    server = EventServer("127.0.0.1", "job12")
    flood = IdleFlood(server.address.host, server.address.port)
    _wait_for(lambda: flood.opened >= flood.count)
    started = time.monotonic()
    clients = [EventClient(server.address, rank=r, host="h") for r in range(4)]
    took = time.monotonic() - started
    for rank, client in enumerate(clients):
        client.send({"kind": "output", "lines": [f"hello from {rank}"]})
    got = sorted(_get(server.events)["rank"] for _ in range(4))
    assert got == [0, 1, 2, 3]
    assert took < 5, took
    flood.end()
    for client in clients:
        client.close()
    server.close()


def test_a_start_timeout_names_the_channel_and_what_it_turned_away():
    """The start timeout said only 'waiting for ranks 0, 1 to start' while idle connections
    held the channel."""
    from hvd_magics.launch.spark_backend import SparkBackend

    server = EventServer("127.0.0.1", "job13")
    backend = object.__new__(SparkBackend)  # the note needs only the channel
    backend._server = server
    assert backend.silence_note([]) == ""
    server.rejected = 3
    assert backend.silence_note([0, 1]) == (
        f"Nothing reached the notebook's event channel (127.0.0.1:{server.address.port}) from "
        "the Spark tasks of ranks 0, 1: Spark did not run them, or they cannot reach this "
        "machine; the channel closed 3 connections that did not authenticate (another process "
        "connecting to it?). ")
    server.close()


def test_orders_sent_to_one_rank_from_several_threads_all_arrive_and_the_task_stays():
    """Regression: the order's sequence number was taken under the lock but the frame was sent
    outside it, so two of the driver's threads (the link probe, the stacks or the meeting)
    could send frames out of order or interleaved; the task read a bad frame, took the driver
    for gone and killed its rank, which was then reported killed (the estimator on two hosts:
    "rank 0 ... ended with its keeper (pid N), which was killed without a word")."""
    server = EventServer("127.0.0.1", "job10")
    orders, closed = queue.Queue(), threading.Event()
    client = EventClient(server.address, 0, "h", on_close=lambda why: closed.set(),
                         on_order=orders.put)
    _wait_for(lambda: 0 in server._by_rank)
    blob = "y" * (256 * 1024)  # larger than a socket buffer: a send takes several writes

    def send(thread: int) -> None:
        for i in range(40):
            assert server.send_order(0, {"kind": "take_stacks", "request": "r", "thread": thread,
                                         "i": i, "blob": blob})

    senders = [threading.Thread(target=send, args=(t,), daemon=True) for t in range(4)]
    for sender in senders:
        sender.start()
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 160 and not closed.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            got.append(orders.get(timeout=0.1))
    assert not closed.is_set(), "the task took the driver for gone"
    assert len(got) == 160, f"{len(got)} of 160 orders arrived in 60 s"
    for thread in range(4):  # each thread's orders in its order
        assert [o["i"] for o in got if o["thread"] == thread] == list(range(40))
    client.close()
    server.close()
