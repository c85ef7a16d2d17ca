"""The event channel: signed lines are accepted, anything else drops the connection."""
import queue
import socket
import time

from hvd_magics.events import ChannelAddress, EventClient, EventServer, decode, encode


def _get(q, timeout=5.0):
    return q.get(timeout=timeout)


def test_signed_events_arrive_in_order_with_rank_and_host():
    server = EventServer("127.0.0.1", "job1")
    client = EventClient(server.address, rank=3, host="hostA")
    for i in range(50):
        client.send("output", lines=[f"line {i}"])
    got = [_get(server.events) for _ in range(50)]
    assert [e["lines"][0] for e in got] == [f"line {i}" for i in range(50)]
    assert {(e["rank"], e["host"], e["job"]) for e in got} == {(3, "hostA", "job1")}
    client.close()
    server.close()


def test_a_line_with_a_wrong_signature_is_dropped_with_its_connection():
    server = EventServer("127.0.0.1", "job2")
    forged = ChannelAddress(server.address.host, server.address.port, b"x" * 32, "job2")
    sock = socket.create_connection((forged.host, forged.port))
    sock.sendall(encode(forged.secret, {"kind": "result", "rank": 0, "job": "job2"}))
    deadline = time.monotonic() + 5
    while server.rejected == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.rejected == 1
    assert sock.recv(10) == b""  # the server closed it
    assert server.events.empty()
    server.close()


def test_events_of_another_job_are_refused():
    server = EventServer("127.0.0.1", "job3")
    other = ChannelAddress(server.address.host, server.address.port, server.address.secret, "job4")
    client = EventClient(other, rank=0, host="h")
    client.send("result", value=None)
    deadline = time.monotonic() + 5
    while server.rejected == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.rejected == 1 and server.events.empty()
    server.close()


def test_closing_the_server_tells_clients():
    server = EventServer("127.0.0.1", "job5")
    closed = queue.Queue()
    EventClient(server.address, 0, "h", on_close=lambda: closed.put(True))
    time.sleep(0.2)
    server.close()
    assert closed.get(timeout=5) is True


def test_decode_rejects_tampered_body():
    secret = b"s" * 32
    line = encode(secret, {"kind": "x", "rank": 1})
    assert decode(secret, line)["rank"] == 1
    assert decode(secret, line.replace(b'"rank":1', b'"rank":2')) is None
