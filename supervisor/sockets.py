"""The one listening socket, bound by the supervisor and shared by every API server."""

from __future__ import annotations

import socket

LISTEN_BACKLOG = 2048


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind and listen; port 0 asks the kernel for a free port (read it back from getsockname)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def bound_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])
