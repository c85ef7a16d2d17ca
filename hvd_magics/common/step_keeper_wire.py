"""What a host's keeper of kept steps (:mod:`hvd_magics.rank.step_keeper`) is asked over TCP, and
the asking: a part of a step (a rank of a later attempt whose host lacks it), or to drop a job's
steps (the driver, once the job succeeded).

A request is one JSON line, ``{"op": "get" | "put" | "drop", "job": key, "secret": ...,
"file": name, "size": bytes}``; a keeper answers only a request whose secret is the job's (its
digest is in the job's folder; a ``put`` to a host that holds nothing of the job yet makes the
folder with it). ``get`` is answered by the part's length (8 bytes) and its bytes, or
:data:`MISSING`; ``put`` sends ``size`` bytes after its line (a rank's part of a sharded step,
for the peer host to hold) and ``put`` and ``drop`` are answered by one byte.
"""
from __future__ import annotations

import hashlib
import json
import secrets
import socket
import struct
from typing import BinaryIO

_LENGTH = struct.Struct("<Q")
#: The length a keeper answers for a part it does not hold.
MISSING = 2 ** 64 - 1
#: Seconds a request may take to connect, and between two reads.
CONNECT_S = 3.0
READ_S = 30.0


def new_secret() -> str:
    """A job's secret for its keepers."""
    return secrets.token_hex(16)


def digest(secret: str) -> str:
    """What a job's folder keeps of its secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def request_line(op: str, job: str, secret: str, file: str = "", size: int = 0) -> bytes:
    return json.dumps({"op": op, "job": job, "secret": secret, "file": file,
                       "size": size}).encode() + b"\n"


def length_bytes(length: int) -> bytes:
    return _LENGTH.pack(length)


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (the host may hold colons: IPv6) as a pair."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def fetch(address: str, job: str, secret: str, file: str) -> bytes | None:
    """The bytes of ``file`` of ``job`` from the keeper at ``address``; ``None`` when it holds
    none.

    Raises
    ------
    OSError
        The keeper cannot be reached, or the connection broke.
    """
    with _connect(address) as conn:
        conn.sendall(request_line("get", job, secret, file))
        (length,) = _LENGTH.unpack(_read(conn, _LENGTH.size))
        return None if length == MISSING else _read(conn, length)


def put(address: str, job: str, secret: str, file: str, handle: BinaryIO, size: int) -> bool:
    """Send ``size`` bytes of ``handle`` as ``file`` of ``job`` to the keeper at ``address``;
    whether it holds them now.

    Raises
    ------
    OSError
        The keeper cannot be reached, or the connection broke.
    """
    with _connect(address) as conn:
        conn.sendall(request_line("put", job, secret, file, size))
        conn.sendfile(handle, 0, size)
        return conn.recv(1) == b"\x01"


def drop(address: str, job: str, secret: str) -> bool:
    """Ask the keeper at ``address`` to remove ``job``'s steps; whether it answered."""
    try:
        with socket.create_connection(split_address(address), timeout=CONNECT_S) as conn:
            conn.settimeout(CONNECT_S)
            conn.sendall(request_line("drop", job, secret))
            return conn.recv(1) == b"\x01"
    except (OSError, ValueError):
        return False


def _connect(address: str) -> socket.socket:
    """A connection to the keeper at ``address`` (``CONNECT_S`` to make it, ``READ_S`` a read)."""
    conn = socket.create_connection(split_address(address), timeout=CONNECT_S)
    conn.settimeout(READ_S)
    return conn


def _read(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 22))
        if not chunk:
            raise ConnectionError(f"a keeper's answer ended {left:,} bytes short")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
