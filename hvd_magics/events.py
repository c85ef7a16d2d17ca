"""The event channel: structured messages from ranks (and their supervisors) to the driver.

Every message is one line: ``<hmac-sha256 hex> <json>``. The JSON object has at least ``kind``,
``rank``, ``time`` and ``job``. The HMAC is keyed with a per-job secret that only the driver and the
processes it launched know; the driver verifies each line before it parses it, drops a connection
that sends a bad line, and never unpickles anything that did not pass. The server listens on one
address (the driver's), never on all interfaces.

Closing the server closes every connection; a rank or supervisor that sees its connection close
takes that as the order to stop (see :mod:`hvd_magics.rank_main`).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import queue
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

#: Longest line the server accepts (a rank's result travels as one line).
MAX_LINE_BYTES = 512 * 1024 * 1024


def sign(secret: bytes, body: bytes) -> bytes:
    """Return the hex HMAC-SHA256 of ``body`` under ``secret``."""
    return hmac.new(secret, body, hashlib.sha256).hexdigest().encode()


def encode(secret: bytes, event: dict[str, Any]) -> bytes:
    """Serialise one event as a signed line."""
    body = json.dumps(event, separators=(",", ":")).encode()
    return sign(secret, body) + b" " + body + b"\n"


def decode(secret: bytes, line: bytes) -> dict[str, Any] | None:
    """Verify and parse one signed line; ``None`` when the signature does not match."""
    mac, _, body = line.rstrip(b"\n").partition(b" ")
    if not hmac.compare_digest(mac, sign(secret, body)):
        return None
    return json.loads(body)


@dataclass(frozen=True)
class ChannelAddress:
    """Where supervisors send their events, and the secret they sign them with (shipped in
    the Spark closure)."""

    host: str
    port: int
    secret: bytes
    job_id: str


class EventServer:
    """Accept signed event lines from ranks and put the verified events on a queue.

    Parameters
    ----------
    host : str
        The address to listen on (the driver's address as the ranks reach it).
    job_id : str
        Written into the address; events from another job are dropped.
    events : queue.Queue, optional
        Where verified events go (a new queue when not given).
    """

    def __init__(self, host: str, job_id: str,
                 events: queue.Queue[dict[str, Any]] | None = None) -> None:
        self.events = queue.Queue() if events is None else events
        self._secret = secrets.token_bytes(32)
        self._job_id = job_id
        self._sock = socket.create_server((host, 0))
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.rejected = 0
        self.address = ChannelAddress(host, self._sock.getsockname()[1], self._secret, job_id)
        threading.Thread(target=self._accept_loop, name="hvd-events-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._read_loop, args=(conn,), name="hvd-events-read",
                             daemon=True).start()

    def _read_loop(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            for line in reader:
                if len(line) > MAX_LINE_BYTES:
                    self.rejected += 1
                    return
                event = decode(self._secret, line)
                if event is None or event.get("job") != self._job_id:
                    self.rejected += 1
                    return  # drop the whole connection: it does not hold the secret
                event["recv"] = time.monotonic()
                self.events.put(event)
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        """Stop listening and close every connection (ranks take it as a stop order)."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self._sock.close()


class EventClient:
    """Send signed events to the driver from a rank or its supervisor.

    Parameters
    ----------
    address : ChannelAddress
        Where the driver listens.
    rank : int
        Stamped on every event.
    host : str
        Stamped on every event.
    on_close : callable, optional
        Called once (from a background thread) when the driver closes the connection.
    """

    def __init__(self, address: ChannelAddress, rank: int, host: str,
                 on_close: Callable[[], None] | None = None) -> None:
        self._address = address
        self._rank = rank
        self._host = host
        self._sock = socket.create_connection((address.host, address.port), timeout=30)
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        if on_close is not None:
            threading.Thread(target=self._watch, args=(on_close,), name="hvd-events-watch",
                             daemon=True).start()

    def _watch(self, on_close: Callable[[], None]) -> None:
        try:
            while self._sock.recv(1024):
                pass
        except OSError:
            pass
        on_close()

    def send(self, kind: str, **payload: Any) -> None:
        """Send one event of ``kind`` with ``payload`` fields."""
        event = {"kind": kind, "rank": self._rank, "host": self._host, "time": time.time(),
                 "job": self._address.job_id, **payload}
        data = encode(self._address.secret, event)
        with self._lock:
            self._sock.sendall(data)

    def close(self) -> None:
        """Close the connection."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._sock.close()
