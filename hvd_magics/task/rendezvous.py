"""The HTTP key-value store a fixed-size Horovod job's ranks meet through (Gloo's rendezvous),
in the standard library only: it runs in rank 0's Spark task, whose Python may have no Horovod
(an executor given the notebook's shipped environment has pyspark and little else; the ranks
run the shipped interpreter).

It speaks what Horovod's Gloo ``HTTPStore`` asks (``horovod.runner.http.http_server``'s
``RendezvousHandler``): ``PUT /scope/key`` stores a value, ``GET /scope/key`` returns it (404
until it is there: the ranks poll), ``DELETE /scope/key`` says that rank is done with the scope;
a scope of the plan (``global``, ``local_<host>``, ``cross_<local rank>``) is cleared once each of
its ranks said so, an ad-hoc scope loses the key.
"""
from __future__ import annotations

import collections
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from collections.abc import Callable, Sequence

#: Seconds a request may take (Horovod's own server allows 3).
REQUEST_TIMEOUT_S = 3


def scope_sizes(slots: Sequence[Any]) -> dict[str, int]:
    """How many ranks each scope of the plan has (what a scope is cleared after)."""
    sizes: dict[str, int] = {}
    for slot in slots:
        sizes["global"] = slot.size
        sizes[f"local_{slot.hostname}"] = slot.local_size
        sizes[f"cross_{slot.local_rank}"] = slot.cross_size
    return sizes


class _Handler(BaseHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT_S
    server: _Server

    def _scope_key(self) -> tuple[str, str] | None:
        parts = self.path.split("/")
        if len(parts) != 3:
            self._answer(400)
            return None
        return parts[1], parts[2]

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if (found := self._scope_key()) is None:
            return
        with self.server.lock:
            value = self.server.store.get(found[0], {}).get(found[1])
        self._answer(404) if value is None else self._answer(200, value)

    def do_PUT(self) -> None:  # noqa: N802
        if (found := self._scope_key()) is None:
            return
        try:
            value = self.rfile.read(int(self.headers["Content-Length"]))
        except TimeoutError:
            self._answer(408)
            return
        with self.server.lock:
            self.server.store.setdefault(found[0], {})[found[1]] = value
        self._answer(200)

    def do_DELETE(self) -> None:  # noqa: N802
        if (found := self._scope_key()) is None:
            return
        scope, key = found
        with self.server.lock:
            if scope in self.server.sizes:  # a scope of the plan: cleared when all are done
                done = self.server.finished[scope]
                done.append(key)
                if len(done) == self.server.sizes[scope]:
                    self.server.store.get(scope, {}).clear()
                    self.server.finished.clear()
            elif key in self.server.store.get(scope, {}):
                del self.server.store[scope][key]
                if not self.server.store[scope]:
                    del self.server.store[scope]
        self._answer(200)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        pass  # nothing per request on stderr (a notebook would show it)


class _Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True

    def __init__(self, log: Callable[[str], None] | None) -> None:
        super().__init__(("", 0), _Handler)
        self.lock = threading.Lock()
        self.store: dict[str, dict[str, bytes]] = {}
        self.sizes: dict[str, int] = {}
        self.finished: dict[str, list[str]] = collections.defaultdict(list)
        self._log = log

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ARG002
        """A request that failed (a rank killed while it talked to us) is one line for the
        log, not the traceback ``socketserver`` prints: the rank's own exit says what
        happened."""
        if self._log is not None:
            error = sys.exc_info()[1]
            self._log(f"rendezvous request from {client_address} failed: "
                      f"{type(error).__name__}: {error}")


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
        self._server = _Server(log)
        self._server.sizes = scope_sizes(slots)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={
            "poll_interval": 0.05}, name="hvd-rendezvous", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
