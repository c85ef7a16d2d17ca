"""The event channel: structured messages from rank supervisors to the driver, over TCP.

Wire format, per connection:

1. The server sends a fresh random nonce (``NONCE_BYTES``).
2. Every frame the client sends is ``<4-byte big-endian length><32-byte MAC><JSON body>``, with
   ``MAC = HMAC-SHA256(secret, nonce + 8-byte sequence number + body)``. The first frame
   (sequence 0) is a ``hello`` naming the job and the rank; it may be at most
   ``HELLO_MAX_BYTES`` long and must arrive within ``HANDSHAKE_TIMEOUT_S``.
3. Only after the hello verified does the server accept frames up to ``MAX_FRAME_BYTES`` (a
   rank's result travels as one frame). A peer without the secret therefore costs the driver one
   small buffer and a few seconds of one thread, never memory in proportion to what it sends; at
   most ``MAX_PENDING_HANDSHAKES`` such peers are served at once, and a new connection when that
   many wait closes the one that has waited longest (so idle peers cannot keep the ranks out: a
   rank sends its hello as soon as it has the nonce, and a client turned away tries again).
4. Every ``BEAT_EVERY_S`` the client sends a ``beat`` frame, which the server does not queue: it
   notes when it last heard each rank's supervisor (:attr:`EventServer.heard`), so the driver
   knows within seconds that a host went silent (its link or machine lost), where TCP alone
   notices nothing for minutes.
5. The client's last frame is ``bye``. When a connection ends, the server queues a
   ``channel_closed`` event for its rank with ``clean`` telling whether ``bye`` came first: a rank
   whose supervisor vanished (its executor was lost) is told apart from one that finished.
6. The driver may send orders the other way on the same connection (an elastic job tells a
   waiting task which rank to start): frames of the same form, MACed over ``DOWN + nonce +
   sequence + body`` with their own sequence, so no frame can be replayed in either direction.

The server listens on one address (the driver's), never on all interfaces, and never unpickles
anything. Closing the server closes every connection; a supervisor that sees its connection close
takes that as the order to stop its rank.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import queue
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast
from collections.abc import Callable, Mapping

from hvd_magics.events import (BeatFrame, ByeFrame, ChannelClosedEvent, Event, HelloFrame,
                               LinkProbeEvent, Order, ProbeLinkOrder, Wire, to_wire)
from hvd_magics.protocol import (BEAT, BYE, CHANNEL_CLOSED, HELLO, LINK_PROBE, PROBE_LINK,
                                 is_order)
from hvd_magics.thread_cpu import ThreadCpu

#: Bytes of the per-connection nonce the server sends first.
NONCE_BYTES = 32
#: Largest first frame (the hello) accepted from a connection that has not yet authenticated.
HELLO_MAX_BYTES = 1024
#: Seconds a new connection has to send its hello.
HANDSHAKE_TIMEOUT_S = 5.0
#: Most connections that may be in their handshake at once (a new one closes the oldest).
MAX_PENDING_HANDSHAKES = 64
#: Largest frame from an authenticated connection (a rank's result is one frame).
MAX_FRAME_BYTES = 512 * 1024 * 1024
#: The most bytes a link probe's answer carries (hvd_magics.job.readings.link_probe).
MAX_PROBE_BYTES = 64 * 1024 * 1024
#: Seconds a supervisor tries to reach the driver before it gives up.
CONNECT_TIMEOUT_S = 30.0
#: Bytes read from the socket at a time.
READ_CHUNK_BYTES = 1 << 20
#: Seconds between a supervisor's beats.
BEAT_EVERY_S = 1.0

_HEADER = struct.Struct(">I32s")
_SEQ = struct.Struct(">Q")
#: Prefix of the MAC of frames the driver sends to a task (orders), which keeps them apart from
#: the task's own frames.
DOWN = b"down"


#: Any kind of event, kept as the kind it is.
AnyEvent = TypeVar("AnyEvent", bound=Event)


def stamp(event: AnyEvent, rank: int, host: str, job_id: str) -> AnyEvent:
    """``event`` as a supervisor sends it: its kind, stamped with who, where and when, then its
    fields (a new record of the same kind)."""
    return cast(AnyEvent, {"kind": event["kind"], "rank": rank, "host": host, "time": time.time(),
                           "job": job_id, **event})


def frame_mac(secret: bytes, nonce: bytes, seq: int, body: bytes) -> bytes:
    """The MAC of frame ``seq`` of the connection that got ``nonce``."""
    return hmac.new(secret, nonce + _SEQ.pack(seq) + body, hashlib.sha256).digest()


def encode_frame(secret: bytes, nonce: bytes, seq: int, event: Mapping[str, Any]) -> bytes:
    """Serialise one event as a signed frame."""
    body = json.dumps(event, separators=(",", ":")).encode()
    return _HEADER.pack(len(body), frame_mac(secret, nonce, seq, body)) + body


def read_frame(conn: socket.socket, secret: bytes, nonce: bytes, seq: int,
               limit: int = MAX_FRAME_BYTES) -> Wire | None:
    """Read and verify frame ``seq`` (``None`` at a clean end of the stream)."""
    header = read_exact(conn, _HEADER.size)
    if header is None:
        return None
    length, mac = _HEADER.unpack(header)
    if length > limit:
        raise Rejected("frame too long")
    body = read_exact(conn, length) or b""
    if not hmac.compare_digest(mac, frame_mac(secret, nonce, seq, body)):
        raise Rejected("bad signature")
    return json.loads(body)


def accept_loop(sock: socket.socket, take: Callable[[socket.socket], bool]) -> None:
    """Accept connections on the listening ``sock`` and hand each to ``take``, until the socket
    is closed or ``take`` says ``False`` (run in a listener's own thread: the event server's,
    a warm pool's shard receiver's)."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        if not take(conn):
            return


class Rejected(Exception):
    """The peer broke the protocol; drop its connection."""


def read_exact(conn: socket.socket, size: int) -> bytes | None:
    """Read exactly ``size`` bytes (``None`` at a clean end of stream before the first byte)."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:], min(size - got, READ_CHUNK_BYTES))
        if n == 0:
            if got == 0:
                return None
            raise Rejected("connection ended inside a frame")
        got += n
    return bytes(buf)


@dataclass(frozen=True)
class ChannelAddress:
    """Where supervisors send their events, and the secret they sign them with (shipped in
    the Spark closure)."""

    host: str
    port: int
    secret: bytes
    job_id: str


class EventSink(Protocol):
    """Where events go (those an :class:`EventServer` verified, a backend's): a ``queue.Queue``,
    a job's :class:`hvd_magics.launch.meeting_point.MeetingPoint` in front of one, or a warm
    pool's :class:`hvd_magics.job.pool_cell.CellEvents`."""

    def put(self, event: Wire) -> None: ...


@dataclass(eq=False)
class _Downlink:
    """The driver's way to one supervisor: its connection, its nonce, the next order's sequence
    number, and the lock one order holds from its number to its last byte."""

    conn: socket.socket
    nonce: bytes
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class EventServer:
    """Accept authenticated event frames from supervisors and put the events on a queue.

    Parameters
    ----------
    host : str
        The address to listen on (the driver's address as the ranks reach it).
    job_id : str
        Written into the address; a hello for another job is refused.
    events : EventSink, optional
        Where verified events go (a new ``queue.Queue`` when not given).
    """

    def __init__(self, host: str, job_id: str, events: EventSink | None = None) -> None:
        self.events: EventSink = queue.Queue() if events is None else events
        self._secret = secrets.token_bytes(32)
        self._job_id = job_id
        self._sock = socket.create_server((host, 0))
        self._conns: set[socket.socket] = set()
        #: Per rank (as its hello named it): the way down to its supervisor.
        self._by_rank: dict[int, _Downlink] = {}
        self._dropped: set[int] = set()
        self._readers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closed = False
        #: Closed, but still greeting tasks that connect late, to close them at once.
        self._lingering = False
        #: Ranks whose supervisor said hello (turned away or not).
        self.greeted: set[int] = set()
        #: Connections in their handshake, oldest first.
        self._pending: list[socket.socket] = []
        #: Connections closed for breaking the protocol or for not authenticating in time.
        self.rejected = 0
        #: Per rank whose supervisor said hello: when a frame of it last arrived (monotonic).
        self.heard: dict[int, float] = {}
        self.address = ChannelAddress(host, self._sock.getsockname()[1], self._secret, job_id)
        self._accepter = threading.Thread(target=accept_loop, args=(self._sock, self._take),
                                          name="hvd-events-accept", daemon=True)
        self._accepter.start()

    @property
    def open_connections(self) -> int:
        """Connections still being read (handshaking ones included)."""
        with self._lock:
            return len(self._readers)

    def _take(self, conn: socket.socket) -> bool:
        """A new connection: read by its own thread, turned away after a lingering close, or
        closed (``False``: the server is closed, stop accepting)."""
        _no_delay(conn)
        with self._lock:
            if self._closed and self._lingering:
                threading.Thread(target=self._turn_away, args=(conn,),
                                 name="hvd-events-turn-away", daemon=True).start()
                return True
            if self._closed:
                conn.close()
                return False
            if len(self._pending) >= MAX_PENDING_HANDSHAKES:
                _shut(self._pending.pop(0))  # its reader counts it as rejected
            self._pending.append(conn)
            self._conns.add(conn)
            reader = threading.Thread(target=self._read_loop, args=(conn,),
                                      name="hvd-events-read", daemon=True)
            self._readers.add(reader)
        reader.start()
        return True

    def _handshake(self, conn: socket.socket) -> tuple[bytes, int]:
        """Send the nonce, verify the hello; return ``(nonce, rank)``."""
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        nonce = secrets.token_bytes(NONCE_BYTES)
        conn.sendall(nonce)
        hello = read_frame(conn, self._secret, nonce, 0, HELLO_MAX_BYTES)
        if hello is None:
            raise Rejected("closed before its hello")
        if hello.get("kind") != HELLO or hello.get("job") != self._job_id:
            raise Rejected("not a hello for this job")
        conn.settimeout(None)
        return nonce, int(hello["rank"])

    def _read_loop(self, conn: socket.socket) -> None:
        rank: int | None = None
        clean = False
        try:
            try:
                nonce, rank = self._handshake(conn)
            finally:
                with self._lock:
                    if conn in self._pending:
                        self._pending.remove(conn)
            with self._lock:
                self._by_rank[rank] = _Downlink(conn, nonce)
                self.greeted.add(rank)
            self.heard[rank] = time.monotonic()
            seq = 1
            while True:
                event = read_frame(conn, self._secret, nonce, seq)
                if event is None:
                    break
                seq += 1
                self.heard[rank] = time.monotonic()
                if event.get("kind") == BEAT:
                    continue
                if event.get("kind") == BYE:
                    clean = True
                    continue
                event["recv"] = time.monotonic()
                self.events.put(event)
        except (Rejected, ValueError, KeyError, TypeError, TimeoutError):
            self.rejected += 1
        except OSError:
            self.rejected += rank is None and not self._closed
        finally:
            conn.close()
            if rank is not None:  # a connection the driver closed itself was not lost
                self.events.put(to_wire(ChannelClosedEvent(
                    kind=CHANNEL_CLOSED, rank=rank,
                    clean=clean or self._closed or rank in self._dropped,
                    recv=time.monotonic())))
            with self._lock:
                self._conns.discard(conn)
                self._readers.discard(threading.current_thread())
                if rank is not None:
                    down = self._by_rank.get(rank)
                    if down is not None and down.conn is conn:
                        del self._by_rank[rank]

    def send_order(self, rank: int, order: Order | Wire) -> bool:
        """Send ``order`` to the supervisor whose hello named ``rank``; ``False`` when it has no
        open connection (its task ended or was lost)."""
        with self._lock:
            down = self._by_rank.get(rank)
        if down is None:
            return False
        # The number and the bytes under one lock: from two of the driver's threads (the link
        # probe, the stacks, the meeting), frames sent out of their order, or interleaved, are
        # a bad frame to the task, which then takes the driver for gone and kills its rank.
        with down.lock:
            try:
                down.conn.sendall(encode_frame(self._secret, DOWN + down.nonce, down.seq, order))
            except OSError:
                return False
            down.seq += 1
        return True

    def drop(self, rank: int) -> None:
        """Close the connection of ``rank``'s supervisor, which takes it as the order to stop
        its rank (its ``channel_closed`` is then clean)."""
        with self._lock:
            down = self._by_rank.pop(rank, None)
            self._dropped.add(rank)
        if down is not None:
            try:
                down.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _turn_away(self, conn: socket.socket) -> None:
        """A task that connects after a lingering close: greet it, then close the connection,
        which it takes as the stop order (its connection refused, it would fail its stage
        with advice about a network that works)."""
        try:
            self.greeted.add(self._handshake(conn)[1])
        except (Rejected, ValueError, KeyError, TypeError, OSError):
            pass
        finally:
            _shut(conn)
            conn.close()

    def close(self, linger: bool = False) -> None:
        """Close every connection (ranks take it as a stop order); then stop listening and end
        the accept thread, or with ``linger`` (a job stopped while its tasks may still be
        connecting) go on listening to close the late ones the same way, until closed again.
        """
        with self._lock:
            self._closed = True
            self._lingering = linger
            conns = list(self._conns)
        for conn in conns:
            _shut(conn)
        if linger:
            return
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self._sock.close()
        if self._accepter is not threading.current_thread():
            self._accepter.join(timeout=5)


def _shut(conn: socket.socket) -> None:
    """End a connection from another thread (its reader wakes up and closes it)."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _no_delay(sock: socket.socket) -> None:
    """Send each frame at once: events and orders are small and each is awaited, and Nagle's
    algorithm against the peer's delayed ACK held the second of two frames for about 40 ms."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def _open(address: ChannelAddress) -> tuple[socket.socket, bytes]:
    """Connect and read the nonce; try again while the server turns the connection away (it
    closes the connection that waited longest when many wait), up to ``CONNECT_TIMEOUT_S``."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    pause = 0.01
    while True:
        sock = socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_S)
        _no_delay(sock)
        try:
            nonce = read_exact(sock, NONCE_BYTES)
        except (OSError, Rejected):
            nonce = None
        if nonce is not None:
            return sock, nonce
        sock.close()
        if time.monotonic() + pause > deadline:
            raise ConnectionError(f"the driver at {address.host}:{address.port} closed the "
                                  "event channel before the handshake")
        time.sleep(pause)  # a back-off between attempts, not a wait for a condition
        pause = min(pause * 2, 0.5)


class EventClient:
    """Send signed events to the driver from a rank's supervisor.

    Parameters
    ----------
    address : ChannelAddress
        Where the driver listens.
    rank : int
        Stamped on every event.
    host : str or None
        Stamped on every event (``None``: the address of the interface that reaches the driver).
    on_close : callable, optional
        Called once (from a background thread) when the connection from the driver ends, with
        what ended it (``"the notebook closed the event channel"``, a broken connection, a frame
        that failed its check).
    on_order : callable, optional
        Called (from that thread) with each order the driver sends (a verified dict).
    """

    def __init__(self, address: ChannelAddress, rank: int, host: str | None,
                 on_close: Callable[[str], None] | None = None,
                 on_order: Callable[[Order], None] | None = None) -> None:
        self._address = address
        self._rank = rank
        self._sock, nonce = _open(address)
        self._sock.settimeout(None)
        self._nonce = nonce
        self._seq = 0
        self._lock = threading.Lock()
        #: The address of this host's interface that reaches the driver.
        self.local_address = self._sock.getsockname()[0]
        self._host = host if host is not None else self.local_address
        self._send_raw(HelloFrame(kind=HELLO, job=address.job_id, rank=rank))
        self._closed = threading.Event()
        if on_close is not None or on_order is not None:
            threading.Thread(target=self._watch, args=(on_close, on_order),
                             name="hvd-events-watch", daemon=True).start()
        threading.Thread(target=self._beat, name="hvd-events-beat", daemon=True).start()

    def _beat(self) -> None:
        """Say every :data:`BEAT_EVERY_S` that this supervisor is there, until closed."""
        while not self._closed.wait(BEAT_EVERY_S):
            try:
                self._send_raw(BeatFrame(kind=BEAT))
            except OSError:
                return

    def _watch(self, on_close: Callable[[str], None] | None,
               on_order: Callable[[Order], None] | None) -> None:
        """Read the driver's orders until it closes the connection (or sends a bad frame)."""
        seq, cpu = 0, ThreadCpu()
        why = "the notebook closed the event channel"
        try:
            while True:
                waited = cpu.seconds()[1]  # blocked in the read below, it waits for no CPU
                order = read_frame(self._sock, self._address.secret, DOWN + self._nonce, seq)
                if order is None:
                    break
                seq += 1
                if not is_order(order):
                    continue
                if order["kind"] == PROBE_LINK:  # the channel's own: answered at once
                    self._answer_probe(order, cpu, waited)
                    continue
                if on_order is not None:
                    on_order(order)
        except OSError as exc:
            why = f"the event channel from the notebook broke ({exc})"
        except (Rejected, ValueError) as exc:
            why = f"a frame from the notebook failed its check ({exc})"
        cpu.close()
        if on_close is not None:
            on_close(why)

    def _answer_probe(self, order: ProbeLinkOrder, cpu: ThreadCpu, waited: float) -> None:
        """Answer a :data:`PROBE_LINK` order with the bytes it asks for, then say how long this
        thread waited for a CPU from the order's first byte to the answer's last: a host whose
        CPUs are busy answers late on any link (hvd_magics.job.readings.link_probe)."""
        size = min(int(order.get("answer_bytes") or 0), MAX_PROBE_BYTES)
        request = str(order.get("request", ""))
        self.send(LinkProbeEvent(kind=LINK_PROBE, request=request,
                                 data=base64.b64encode(os.urandom(size)).decode()))
        self.send(LinkProbeEvent(
            kind=LINK_PROBE, request=request,
            cpu_wait_s=round(cpu.seconds()[1] - waited, 6) if cpu.readable else None))

    def _send_raw(self, event: Event | HelloFrame | BeatFrame | ByeFrame) -> None:
        with self._lock:
            frame = encode_frame(self._address.secret, self._nonce, self._seq, event)
            self._seq += 1
            self._sock.sendall(frame)

    def send(self, event: Event) -> None:
        """Send ``event``, stamped (:func:`stamp`)."""
        self._send_raw(stamp(event, self._rank, self._host, self._address.job_id))

    def close(self) -> None:
        """Say goodbye and close the connection."""
        self._closed.set()
        try:
            self._send_raw(ByeFrame(kind=BYE))
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._sock.close()
