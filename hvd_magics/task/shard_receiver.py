"""A warm pool's task receives its rank's shards of a DataFrame a later cell reads (executor side).

A pool's barrier tasks hold their slots, so the rows of a DataFrame that a cell on the pool
reads are dealt by a second, ordinary Spark stage beside them
(:mod:`hvd_magics.task.deal_task`): its task ``p`` connects to the :class:`ShardReceiver` of
the pool's rank ``p`` (on the rank's host, wherever the dealing task ran) and streams its rows
as Arrow batches, which the receiver writes with :func:`hvd_magics.task.shard_files.write_shards`
to ``<folder>/<deal>/<source>.arrow``: the rank's disk, checked for space as on a cold job.

Wire, per connection (the event channel's signed frames, :mod:`hvd_magics.channel`): the
receiver sends a nonce; the dealer sends one frame ``{"deal", "names", "rows"}`` MACed with the
pool's channel secret over ``DATA + nonce``; when ``rows`` is true an Arrow IPC stream of the
tagged rows follows to the end of the dealer's half of the connection; the receiver answers one
frame ``{"shards": [...]}`` or ``{"error": "..."}`` over ``DATA + DOWN + nonce``. Nothing is
unpickled.
"""
from __future__ import annotations

import secrets
import shutil
import socket
import threading
import traceback
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from hvd_magics.channel import (DOWN, NONCE_BYTES, Rejected, accept_loop, encode_frame,
                                read_exact, read_frame)
from hvd_magics.errors import ShardSpaceError
from hvd_magics.task.shard_files import write_shards

#: Prefix of the MACs of the data connection's frames (kept apart from the event channel's).
DATA = b"data"
#: Seconds a dealer has to send its header.
HEADER_TIMEOUT_S = 10.0
#: Largest header frame.
HEADER_MAX_BYTES = 64 * 1024


def deal_folder(folder: Path, deal: str) -> Path:
    """Where the shards of one deal go (``deal`` is checked to be a plain name)."""
    if not deal.isalnum():
        raise ValueError(f"bad deal id {deal!r}")
    return folder / deal


class ShardReceiver:
    """Listen for a pool rank's shards on all interfaces; write them under ``folder``.

    Parameters
    ----------
    folder : Path
        The task's shard folder; removed by :meth:`close`.
    secret : bytes
        The pool's channel secret: only a dealer that knows it is served.
    """

    def __init__(self, folder: Path, secret: bytes) -> None:
        self.folder = folder
        self._secret = secret
        self._sock = socket.create_server(("", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=accept_loop, args=(self._sock, self._take),
                         name="hvd-shard-receiver", daemon=True).start()

    def _take(self, conn: socket.socket) -> bool:
        threading.Thread(target=self._serve, args=(conn,), name="hvd-shard-receive",
                         daemon=True).start()
        return True

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            nonce = secrets.token_bytes(NONCE_BYTES)
            try:
                conn.settimeout(HEADER_TIMEOUT_S)
                conn.sendall(nonce)
                header = read_frame(conn, self._secret, DATA + nonce, 0, HEADER_MAX_BYTES)
                conn.settimeout(None)
            except Exception:  # noqa: BLE001 - not a dealer of this pool: drop it
                return
            if header is None:
                return
            reply: dict[str, Any]
            try:
                reply = {"shards": self._receive(conn, header)}
            except ShardSpaceError as exc:
                reply = {"error": str(exc)}
            except Exception:  # noqa: BLE001 - reported to the dealer, which reports it
                reply = {"error": f"on {socket.gethostname()}: {traceback.format_exc()}"}
            try:
                conn.sendall(encode_frame(self._secret, DATA + DOWN + nonce, 0, reply))
            except OSError:
                pass

    def _receive(self, conn: socket.socket, header: dict[str, Any]) -> list[Mapping[str, Any]]:
        import pyarrow as pa

        names = {int(index): name for index, name in header["names"].items()}
        target = deal_folder(self.folder, str(header["deal"]))
        target.mkdir(parents=True, exist_ok=True)
        if not header.get("rows"):
            return [{"source": index, "rows": 0, "bytes": 0, "path": ""} for index in names]
        with conn.makefile("rb") as stream, pa.ipc.open_stream(stream) as reader:
            return [shard.as_dict() for shard in write_shards(reader, target, names)]

    def drop(self, deal: str) -> None:
        """Delete the shards of one deal (a rank that still maps them keeps its mapping)."""
        shutil.rmtree(deal_folder(self.folder, deal), ignore_errors=True)

    def close(self) -> None:
        """Stop listening and delete every shard received."""
        try:
            self._sock.close()
        except OSError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)


def send_rows(address: tuple[str, int], secret: bytes, deal: str, names: dict[int, str],
              batches: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Stream ``batches`` (Arrow record batches of tagged rows) to the receiver at ``address``;
    return what it wrote per source. Raises ``ConnectionError`` with the receiver's error."""
    import pyarrow as pa

    batches = iter(batches)
    first = next(batches, None)
    try:
        with socket.create_connection(address, timeout=timeout) as conn:
            nonce = read_exact(conn, NONCE_BYTES)
            if nonce is None:
                raise ConnectionError("it closed the connection at once")
            conn.settimeout(None)
            header = {"deal": deal, "names": {str(k): v for k, v in names.items()},
                      "rows": first is not None}
            conn.sendall(encode_frame(secret, DATA + nonce, 0, header))
            if first is not None:
                with conn.makefile("wb") as stream:
                    with pa.ipc.new_stream(stream, first.schema) as writer:
                        writer.write_batch(first)
                        for batch in batches:
                            writer.write_batch(batch)
                conn.shutdown(socket.SHUT_WR)
            reply = read_frame(conn, secret, DATA + DOWN + nonce, 0)
    except (OSError, Rejected) as exc:
        raise ConnectionError(f"the pool's task at {address[0]}:{address[1]} did not take the "
                              f"rows ({type(exc).__name__}: {exc})") from None
    if reply is None:
        raise ConnectionError(f"the pool's task at {address[0]}:{address[1]} closed the "
                              "connection without an answer")
    if "error" in reply:
        raise ConnectionError(reply["error"])
    return reply["shards"]

