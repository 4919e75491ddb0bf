"""Local port forwards over SSH (direct-tcpip), so a client on this machine reaches a server bound to
127.0.0.1 on the remote host. Each accepted connection asks `transport_fn` for the current transport, so a
forward keeps working after SSHRunner reconnects."""
from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable

import paramiko


class Forward:
    def __init__(self, transport_fn: Callable[[], paramiko.Transport], host: str, port: int,
                 timeout: float = 15.0):
        self.transport_fn, self.host, self.port, self.timeout = transport_fn, host, port, timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.local_port = self.sock.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept_loop, daemon=True, name=f"fwd-{port}").start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        chan = None
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # no Nagle/delayed-ACK stalls
            chan = self.transport_fn().open_channel("direct-tcpip", (self.host, self.port), peer,
                                                    timeout=self.timeout)
            _pump(conn, chan, self._closed)
        except Exception:          # remote refused, link or peer gone: the client sees the connection close
            pass
        finally:
            conn.close()
            if chan is not None:
                try:
                    chan.close()
                except Exception:  # closing on a dead transport
                    pass

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.close()
        except OSError:
            pass


def _pump(conn: socket.socket, chan: paramiko.Channel, closed: threading.Event) -> None:
    # epoll, not select(): at 512 concurrent requests the descriptors pass select()'s limit of 1024
    with selectors.DefaultSelector() as sel:
        sel.register(conn, selectors.EVENT_READ)
        sel.register(chan, selectors.EVENT_READ)
        while not closed.is_set():
            for key, _ in sel.select(1.0):
                src, dst = (conn, chan) if key.fileobj is conn else (chan, conn)
                data = src.recv(65536)
                if not data:
                    return
                dst.sendall(data)
            transport = chan.get_transport()
            if chan.closed or transport is None or not transport.is_active():
                return
