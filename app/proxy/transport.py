"""An httpx transport whose connections run on plain asyncio streams.

Why: profiling the proxy under load showed most of its CPU in httpcore's default (AnyIO) network
backend, not in proxying: every request makes the pool ask every pooled connection whether it
"is readable" (a ``poll()`` syscall behind several layers of AnyIO attribute lookups), and every
read and write is wrapped in an AnyIO cancel scope. This backend answers ``is_readable`` from the
stream's own EOF state and uses ``asyncio.timeout``; the HTTP logic, pooling and the httpx API
stay httpcore's and httpx's own.

Failures are raised as httpcore's exceptions (``ConnectError``, ``ReadTimeout``...), which httpx
maps to its own, exactly as with the default backend.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

_READ_ERRORS = (OSError, asyncio.IncompleteReadError)


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout("timed out reading from the upstream") from None
        except _READ_ERRORS as exc:
            raise httpcore.ReadError(str(exc) or type(exc).__name__) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError:
            raise httpcore.WriteTimeout("timed out writing to the upstream") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        # Closing never waits on the peer: a proxy closing an upstream request because its
        # client left must not hang on a slow or dead upstream.
        self._writer.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError:
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # Asked of idle keep-alive connections: the only thing an idle connection can have
            # to read is the server's close (EOF) or stray bytes; both retire the connection.
            return self._reader.at_eof() or self._writer.is_closing() or _has_buffered(self._reader)
        if info == "ssl_object":
            return self._writer.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "socket":
            return self._writer.get_extra_info("socket")
        return None


def _has_buffered(reader: asyncio.StreamReader) -> bool:
    buffer = getattr(reader, "_buffer", None)
    return bool(buffer)


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, local_addr=local, limit=2**20
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {host}:{port}") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for option in socket_options or ():
                sock.setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path, limit=2**20)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"timed out connecting to {path}") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` with its pool on :class:`AsyncioBackend` (HTTP/1.1, no proxy).

    Relies on httpx 0.28 keeping its pool in ``_pool`` (pinned in pyproject.toml); the test
    suite runs every upstream call through this transport, so a change there fails loudly.
    """

    def __init__(self, *, limits: httpx.Limits, verify: bool | ssl.SSLContext = True) -> None:
        super().__init__(limits=limits, verify=verify)
        ssl_context = (
            httpx.create_ssl_context(verify=verify)
            if not isinstance(verify, ssl.SSLContext)
            else verify
        )
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=AsyncioBackend(),
        )
