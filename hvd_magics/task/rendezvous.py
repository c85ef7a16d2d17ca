"""The HTTP key-value store a fixed-size Horovod job's ranks meet through (Gloo's rendezvous),
in the standard library only: it runs in rank 0's Spark task, whose Python may have no Horovod
(an executor given the notebook's shipped environment has pyspark and little else; the ranks
run the shipped interpreter).

It speaks what Horovod's Gloo ``HTTPStore`` asks (``horovod.runner.http.http_server``'s
``RendezvousHandler``): ``PUT /scope/key`` stores a value, ``GET /scope/key`` returns it (404
until it is there: the ranks ask again), ``DELETE /scope/key`` says that rank is done with the
scope; a scope of the plan (``global``, ``local_<host>``, ``cross_<local rank>``) is cleared once
each of its ranks said so, an ad-hoc scope loses the key.

Built to keep up with 64 ranks, where ``http.server`` fell over (the ranks' Gloo waits timed out:
``Wait timeout after 30 seconds for key(s): 0``; issue 85). Gloo's full mesh has each rank put its
addresses, then wait for and read every other rank's: about 190 requests a rank, 12,000 at 64
ranks, and Horovod's store asks for a missing key again every 10 ms, so 63 ranks waiting for a
late one sent 6,300 requests a second. Hence:

- a ``GET`` of a missing key is held until the key arrives or :data:`HOLD_S` pass (a long poll:
  Horovod's HTTP client has no time limit of its own, and reads a late answer as a prompt one);
  a rank asks about once per key instead of a hundred times a second;
- one thread answers every connection from a selector: no thread and no ``http.server`` parse
  per request (a request here costs about a tenth of what it cost there);
- the listening socket queues :data:`BACKLOG` connections (``socketserver``'s 5 dropped the
  rest, whose connections then waited out TCP's retry, a second and more each).
"""
from __future__ import annotations

import collections
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

#: Seconds a request may take to arrive whole (Horovod's own server allows 3).
REQUEST_TIMEOUT_S = 3
#: Longest a ``GET`` of a missing key is held waiting for the key (then answered 404, and the rank
#: asks again: Gloo counts its own timeout between asks).
HOLD_S = 2.0
#: Connections the listening socket queues before they are accepted.
BACKLOG = 1024
#: Most bytes of a request's line and headers.
MOST_HEAD = 16 * 1024
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout"}


def scope_sizes(slots: Sequence[Any]) -> dict[str, int]:
    """How many ranks each scope of the plan has (what a scope is cleared after)."""
    sizes: dict[str, int] = {}
    for slot in slots:
        sizes["global"] = slot.size
        sizes[f"local_{slot.hostname}"] = slot.local_size
        sizes[f"cross_{slot.local_rank}"] = slot.cross_size
    return sizes


@dataclass
class _Connection:
    """One client's connection: what it sent so far, and what is left to send it."""

    sock: socket.socket
    address: Any
    #: When it is answered unless something else answers it first: 408 while its request
    #: arrives, 404 while its ``GET`` is held.
    deadline: float
    received: bytearray = field(default_factory=bytearray)
    reply: bytes = b""
    #: ``(scope, key)`` a held ``GET`` waits for.
    held: tuple[str, str] | None = None


class KeyStore:
    """The store's keys and what each request does to them (no sockets: :class:`RendezvousServer`
    answers with what these methods return).

    Parameters
    ----------
    sizes : dict
        Each scope of the plan and how many ranks it has (:func:`scope_sizes`).
    """

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.values: dict[str, dict[str, bytes]] = {}
        self.finished: dict[str, list[str]] = collections.defaultdict(list)

    def get(self, scope: str, key: str) -> bytes | None:
        """The value, or ``None`` while it is missing."""
        return self.values.get(scope, {}).get(key)

    def put(self, scope: str, key: str, value: bytes) -> None:
        """Store ``value``."""
        self.values.setdefault(scope, {})[key] = value

    def delete(self, scope: str, key: str) -> None:
        """A rank is done with a scope of the plan (the scope is cleared when all its ranks
        are), or an ad-hoc key is dropped."""
        if scope in self.sizes:
            done = self.finished[scope]
            done.append(key)
            if len(done) == self.sizes[scope]:
                self.values.get(scope, {}).clear()
                del self.finished[scope]  # another scope's count goes on
        elif key in self.values.get(scope, {}):
            del self.values[scope][key]
            if not self.values[scope]:
                del self.values[scope]


def parse_head(head: bytes) -> tuple[str, str, str, int] | None:
    """``(method, scope, key, content length)`` of a request's line and headers, or ``None``
    when they are not a request for ``/scope/key``."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return None
    path = parts[1].split("/")
    if len(path) != 3:
        return None
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
    return parts[0], path[1], path[2], max(0, length)


class RendezvousServer:
    """A Gloo rendezvous for one fixed-size Horovod job (see the module's docstring).

    Parameters
    ----------
    slots : sequence of RankSlot
        The job's plan (its scopes and their sizes).
    log : callable, optional
        Where a failed request's one line goes (dropped without one).
    """

    def __init__(self, slots: Sequence[Any], log: Callable[[str], None] | None = None) -> None:
        self.store = KeyStore(scope_sizes(slots))
        self._log = log
        self._listener = socket.create_server(("", 0), family=socket.AF_INET, backlog=BACKLOG)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_read, self._wake_write = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        #: Held ``GET``\\ s by the ``(scope, key)`` they wait for.
        self._held: dict[tuple[str, str], list[_Connection]] = collections.defaultdict(list)
        self._open: dict[int, _Connection] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="hvd-rendezvous", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close every socket."""
        self._stopping = True
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    # -- the loop ------------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._stopping:
                for selected, events in self._selector.select(self._next_timeout()):
                    if selected.fileobj is self._listener:
                        self._accept()
                    elif selected.fileobj is not self._wake_read:
                        self._serve_one(selected.data, events)
                self._expire(time.monotonic())
        finally:
            for connection in list(self._open.values()):
                self._close(connection)
            self._selector.close()
            for sock in (self._listener, self._wake_read, self._wake_write):
                sock.close()

    def _serve_one(self, connection: _Connection, events: int) -> None:
        try:
            if events & selectors.EVENT_READ and not connection.reply:
                self._read(connection)
            if events & selectors.EVENT_WRITE:
                self._write(connection)
        except Exception as error:  # noqa: BLE001 - a rank killed while it talked to us (or
            # anything else one request met): a line, not a trace, and the others still served
            if self._log is not None:
                self._log(f"rendezvous request from {connection.address} failed: "
                          f"{type(error).__name__}: {error}")
            self._close(connection)

    def _next_timeout(self) -> float:
        deadlines = [c.deadline for c in self._open.values() if not c.reply]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else 1.0

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            connection = _Connection(sock, address, time.monotonic() + REQUEST_TIMEOUT_S)
            self._open[sock.fileno()] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, connection: _Connection) -> None:
        chunk = connection.sock.recv(65536)
        if not chunk:
            self._close(connection)
            return
        connection.received += chunk
        end = connection.received.find(b"\r\n\r\n")
        if end < 0:
            if len(connection.received) > MOST_HEAD:
                self._answer(connection, 400)
            return
        request = parse_head(bytes(connection.received[:end]))
        if request is None:
            self._answer(connection, 400)
            return
        method, scope, key, length = request
        body = bytes(connection.received[end + 4:])
        if len(body) < length:
            return  # the rest of the body is on its way
        connection.received = bytearray()  # one request a connection (HTTP/1.0)
        self._handle(connection, method, scope, key, body[:length])

    def _handle(self, connection: _Connection, method: str, scope: str, key: str,
                body: bytes) -> None:
        if method == "GET":
            value = self.store.get(scope, key)
            if value is not None:
                self._answer(connection, 200, value)
            else:  # held until the key arrives or HOLD_S pass
                connection.held, connection.deadline = (scope, key), time.monotonic() + HOLD_S
                self._held[(scope, key)].append(connection)
        elif method == "PUT":
            self.store.put(scope, key, body)
            self._answer(connection, 200)
            for waiting in list(self._held.get((scope, key), [])):
                self._unhold(waiting)
                self._answer(waiting, 200, body)
        elif method == "DELETE":
            self.store.delete(scope, key)
            self._answer(connection, 200)
        else:
            self._answer(connection, 405)

    def _expire(self, now: float) -> None:
        for connection in list(self._open.values()):
            if not connection.reply and connection.deadline <= now:
                status = 404 if connection.held else 408
                self._unhold(connection)
                self._answer(connection, status)

    def _unhold(self, connection: _Connection) -> None:
        """``connection``'s ``GET`` no longer waits for its key."""
        if connection.held is None:
            return
        waiting = self._held[connection.held]
        waiting.remove(connection)
        if not waiting:
            del self._held[connection.held]
        connection.held = None

    def _answer(self, connection: _Connection, status: int, body: bytes = b"") -> None:
        connection.reply = (f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Length: "
                            f"{len(body)}\r\nConnection: close\r\n\r\n").encode() + body
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        try:
            self._write(connection)
        except OSError:
            self._close(connection)

    def _write(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.reply)
        except (BlockingIOError, InterruptedError):
            return
        connection.reply = connection.reply[sent:]
        if not connection.reply:
            self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if self._open.pop(connection.sock.fileno(), None) is None:
            return
        self._unhold(connection)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()
