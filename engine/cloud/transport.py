"""The HTTP plumbing under the cloud client: a bearer-token auth object, and sockets a cancel can reach.

Cancel: a request blocked in a read (for the response headers or the next streamed piece) wakes up
at once when its socket is shut down, but not when the socket is closed from another thread. So
the connections a request opens are recorded as urllib3 creates them (`TrackingAdapter` swaps in
pool classes whose connection class registers itself), and `watch_cancel` shuts their sockets
down once the cancel event is set.
"""

from __future__ import annotations

import socket
import threading

import requests.adapters
import requests.auth
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

CANCEL_POLL_S = 0.05       # how often the watcher looks at the cancel event


class BearerAuth(requests.auth.AuthBase):
    """`Authorization: Bearer <key>`, or nothing; its repr never shows the key."""

    def __init__(self, key: str | None) -> None:
        self._key = key
        self.has_key = bool(key)

    def __call__(self, request):
        if self._key:
            request.headers["Authorization"] = f"Bearer {self._key}"
        return request

    def __repr__(self) -> str:
        return "BearerAuth([redacted])" if self._key else "BearerAuth(None)"


class SocketTracker:
    """The connections a request opened, so that cancel can shut their sockets down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: list[HTTPConnection] = []

    def add(self, connection: HTTPConnection) -> None:
        with self._lock:
            self._connections.append(connection)

    def shutdown(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            sock = getattr(connection, "sock", None)
            if sock is None:
                continue
            try:
                # The base-class method also on TLS sockets: shuts the TCP stream down without
                # touching the TLS object that the reading thread is using.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass


class TrackingAdapter(requests.adapters.HTTPAdapter):
    """An HTTPAdapter whose pools register every connection they create with a `SocketTracker`."""

    def __init__(self, tracker: SocketTracker) -> None:
        self._pool_classes = _tracking_pools(tracker)
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pool_classes

    def proxy_manager_for(self, proxy: str, **proxy_kwargs):
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools are their own classes: cancel waits for the timeout there
            manager.pool_classes_by_scheme = self._pool_classes
        return manager


def _tracking_pools(tracker: SocketTracker) -> dict[str, type]:
    class Connection(HTTPConnection):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            tracker.add(self)

    class SecureConnection(HTTPSConnection):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            tracker.add(self)

    class Pool(HTTPConnectionPool):
        ConnectionCls = Connection

    class SecurePool(HTTPSConnectionPool):
        ConnectionCls = SecureConnection

    return {"http": Pool, "https": SecurePool}


def watch_cancel(cancel: threading.Event, finished: threading.Event, tracker: SocketTracker) -> None:
    """Shut the request's sockets down once `cancel` is set, until the request has finished."""
    while not finished.wait(CANCEL_POLL_S):
        if cancel.is_set():
            tracker.shutdown()  # again each poll: a retry may have opened a new connection meanwhile
