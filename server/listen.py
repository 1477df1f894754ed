"""The listening socket, bound before anything slow happens (torch import, model load), so that a busy
port fails in milliseconds. Deliberately light: the CLI imports it before torch."""

from __future__ import annotations

import socket


class PortInUseError(OSError):
    """The listen address cannot be bound (in use, or not ours to bind)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) TCP socket; uvicorn listens and serves on it.

    The protocol must be IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    sockets that say so, and accepted sockets inherit it. With proto 0 every response whose head and
    body go out in two writes waited for the client's delayed ACK: 40 ms on each request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise PortInUseError(f"cannot listen on {host}:{port}: {e.strerror} (address in use?)") from e
    return sock
