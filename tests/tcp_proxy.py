"""A TCP port in front of a server's Unix socket that a test can take away and give back: what a
client sees when the network to its database fails (connections reset, new ones refused) and
when it returns, or a server far away (`answer_delay_s`: every answer waits that long on its
way back; `request_delay_s`: every request on its way there). Threads, not asyncio, so
synchronous code and an event loop can both use it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class TcpProxy:
    def __init__(self, unix_path: str, answer_delay_s: float = 0.0, request_delay_s: float = 0.0) -> None:
        self.unix_path = unix_path
        self.answer_delay_s = answer_delay_s
        self.request_delay_s = request_delay_s
        self.port = 0
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def up(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """New connections are refused and every open one is reset."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            doomed, self._open = self._open, set()
        for connection in doomed:
            with contextlib.suppress(OSError):
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # down()
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.unix_path)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, server))
            ways = ((client, server, self.request_delay_s), (server, client, self.answer_delay_s))
            for source, target, delay_s in ways:
                threading.Thread(target=_pump, args=(source, target, delay_s), daemon=True).start()


def _pump(source: socket.socket, target: socket.socket, delay_s: float) -> None:
    try:
        while data := source.recv(65536):
            time.sleep(delay_s)
            target.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
