"""A small asynchronous HTTP/1.1 server: one asyncio loop in one thread serves every connection.

What the local clusters' API needs and nothing more: requests with `Content-Length` or chunked
bodies, `Expect: 100-continue`, keep-alive (HTTP/1.1 by default, HTTP/1.0 on request), requests
answered in order per connection, and streamed responses (chunked transfer encoding) that keep
their connection until they end. Idle connections are closed after `idle_timeout` seconds.

Why not `http.server.ThreadingHTTPServer`: a thread per connection, each woken for every request
and every watch event, spent most of the cluster process's CPU in thread switches and the GIL
(docs/performance.md, "The local clusters' API"). Here a request is parsed and answered in the
loop's callback (`asyncio.BufferedProtocol.buffer_updated`, no task per request), so its cost is
the handler's. The handler runs on the loop thread: it must not block for long.

The loop runs in a `LoopThread`, which the cluster's controllers share (cluster.py).
`HTTPServer.stop()` closes the listening socket and cuts every connection (clients see a refused
or reset connection), which is how a partition looks; the loop goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import logging
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

__all__ = ["Exchange", "HTTPServer", "LoopThread", "Request", "Stream"]

log = logging.getLogger("gpuorch_localkube.http")

MAX_HEAD = 64 * 1024  # request line and headers
MAX_BODY = 64 * 1024 * 1024
READ_SIZE = 64 * 1024
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


class _Date:
    """The Date header, formatted once per second."""

    second = -1
    value = b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.value = email.utils.formatdate(now, usegmt=True).encode()
            cls.second = now
        return cls.value


class Request:
    __slots__ = ("body", "headers", "method", "target", "version")

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str], body: bytes):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers  # names in lower case
        self.body = body


class _BadRequest(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split()
    if len(words) != 3:
        raise _BadRequest(400, f"Bad request syntax ({lines[0]!r})")
    method, target, version = words
    if not version.startswith("HTTP/1."):
        raise _BadRequest(505, f"Invalid HTTP version ({version})")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequest(400, f"Bad header line ({line!r})")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return method, target, version, headers


def _dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """A chunked body starting at `start`: (body, end offset), or None if not all of it is here."""
    out = bytearray()
    pos = start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = bytes(buf[pos:eol]).split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise _BadRequest(400, "Bad chunk size") from None
        pos = eol + 2
        if size == 0:
            while True:  # trailers, then the empty line
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                if eol == pos:
                    return bytes(out), eol + 2
                pos = eol + 2
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos:pos + size]
        if len(out) > MAX_BODY:
            raise _BadRequest(413, "Request body too large")
        pos += size + 2


def response_head(code: int, headers: list[tuple[str, str]], close: bool) -> bytes:
    lines = [f"HTTP/1.1 {code} {_REASONS.get(code, '')}".encode()]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers]
    lines.append(b"Date: " + _Date.get())
    lines.append(b"Server: localkube")
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Stream:
    """A chunked response in progress. `write` sends one chunk; `end` ends the response."""

    def __init__(self, exchange: Exchange):
        self._x = exchange
        self.closed = False  # the connection is gone (or the stream ended)
        self.on_close: list[Callable[[], None]] = []

    def write(self, data: bytes) -> None:
        if data and not self.closed:
            self._x.conn.transport_write(b"%x\r\n%s\r\n" % (len(data), data))

    def backlog(self) -> int:
        """Bytes written and not yet sent (a slow reader's backlog)."""
        return self._x.conn.buffered()

    def abort(self) -> None:
        """Cut the connection (a reader too slow to follow)."""
        self._x.abort()

    def end(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._x.conn.transport_write(b"0\r\n\r\n")
        self._x.conn.finished(self._x)

    def _lost(self) -> None:
        if self.closed:
            return
        self.closed = True
        for fn in self.on_close:
            fn()


class Exchange:
    """One request and its answer: `respond` once, or `stream` (then `Stream.end`)."""

    __slots__ = ("answered", "close", "conn", "request", "stream_obj")

    def __init__(self, conn: _Conn, request: Request, close: bool):
        self.conn = conn
        self.request = request
        self.close = close
        self.answered = False
        self.stream_obj: Stream | None = None

    def respond(self, code: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        if self.answered:
            raise RuntimeError("answered twice")
        self.answered = True
        hs = [("Content-Type", ctype), ("Content-Length", str(len(body))), ("Cache-Control", "no-cache, private")]
        if headers:
            hs += list(headers.items())
        self.conn.transport_write(response_head(code, hs, self.close) + body)
        self.conn.finished(self)

    def stream(self, ctype: str) -> Stream:
        if self.answered:
            raise RuntimeError("answered twice")
        self.answered = True
        hs = [("Content-Type", ctype), ("Transfer-Encoding", "chunked"), ("Cache-Control", "no-cache, private")]
        self.conn.transport_write(response_head(200, hs, self.close))
        self.stream_obj = Stream(self)
        return self.stream_obj

    def abort(self) -> None:
        """Drop the connection without an answer."""
        self.answered = True
        self.conn.abort()


Handler = Callable[[Exchange], None]


class _Conn(asyncio.BufferedProtocol):
    """One connection. Reads go into one preallocated buffer (`get_buffer`): a plain Protocol's
    transport allocates a 256 KiB bytes object for every read, which cost more than parsing."""

    def __init__(self, server: HTTPServer):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self._rbuf = bytearray(READ_SIZE)
        self._rview = memoryview(self._rbuf)
        self.current: Exchange | None = None  # being answered (a stream, or a delayed request)
        self.closed = False
        self.continued = False  # 100 Continue sent for the request being received
        self.last_active = time.monotonic()

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server._conns.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rview

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        self.buf += self._rview[:nbytes]
        if self.current is None:
            self._process()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._conns.discard(self)
        cur, self.current = self.current, None
        if cur is not None and cur.stream_obj is not None:
            cur.stream_obj._lost()

    # -- requests --------------------------------------------------------------------------------

    def transport_write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def buffered(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None and not self.closed else 0

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def finished(self, x: Exchange) -> None:
        """The answer to `x` is complete: close, or go on with the next request."""
        if self.current is x:
            self.current = None
        self.last_active = time.monotonic()
        if x.close:
            if self.transport is not None and not self.closed:
                self.transport.close()
            self.closed = True
            return
        if self.current is None and self.buf and not self.closed:
            self.server.loop.call_soon(self._process)

    def _fail(self, code: int, message: str) -> None:
        body = f"{code} {message}\n".encode()
        head = response_head(code, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))], True)
        self.transport_write(head + body)
        if self.transport is not None:
            self.transport.close()
        self.closed = True
        self.buf.clear()

    def _process(self) -> None:
        while self.current is None and not self.closed and self.buf:
            try:
                req = self._parse()
            except _BadRequest as e:
                self._fail(e.code, str(e))
                return
            if req is None:
                return
            conn_hdr = req.headers.get("connection", "").lower()
            close = "close" in conn_hdr if req.version != "HTTP/1.0" else "keep-alive" not in conn_hdr
            x = Exchange(self, req, close)
            if req.method not in _METHODS:
                x.close = True
                body = f"Unsupported method ({req.method!r})\n".encode()
                x.respond(501, body, "text/plain; charset=utf-8")
                return
            self.current = x
            delay = self.server.delay
            if delay > 0:
                self.server.loop.call_later(delay, self._handle, x)
                return
            self._handle(x)

    def _handle(self, x: Exchange) -> None:
        if self.closed:
            return
        try:
            self.server.handler(x)
        except Exception:  # pragma: no cover - the handler answers its own errors
            log.exception("unhandled error serving %s %s", x.request.method, x.request.target)
            if not x.answered:
                x.close = True
                x.respond(500, b"internal error\n", "text/plain; charset=utf-8")

    def _parse(self) -> Request | None:
        buf = self.buf
        while buf[:2] == b"\r\n":  # stray line ends between requests
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                raise _BadRequest(431, "Request Header Fields Too Large")
            return None
        method, target, version, headers = _parse_head(bytes(buf[:end]))
        start = end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._continue(headers)
            got = _dechunk(buf, start)
            if got is None:
                return None
            body, stop = got
        else:
            try:
                length = int(headers.get("content-length") or 0)
            except ValueError:
                raise _BadRequest(400, "Bad Content-Length") from None
            if length < 0 or length > MAX_BODY:
                raise _BadRequest(413 if length > 0 else 400, "Bad Content-Length")
            if len(buf) < start + length:
                self._continue(headers)
                return None
            body, stop = bytes(buf[start:start + length]), start + length
        del buf[:stop]
        self.continued = False
        return Request(method, target, version, headers, body)

    def _continue(self, headers: dict[str, str]) -> None:
        if not self.continued and headers.get("expect", "").lower() == "100-continue":
            self.continued = True
            self.transport_write(b"HTTP/1.1 100 Continue\r\n\r\n")


class LoopThread:
    """An asyncio loop in a daemon thread of its own: the API and the controllers of one cluster."""

    def __init__(self, name: str):
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ident = -1

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            self._ident = threading.get_ident()
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            try:
                loop.run_forever()
            finally:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self.loop = loop
        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        started.wait()

    def stop(self, timeout: float = 30.0) -> None:
        thread, loop = self._thread, self.loop
        if thread is None or loop is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=timeout)
        self._thread = None

    def on_loop(self) -> bool:
        """Is the caller the loop's thread?"""
        return threading.get_ident() == self._ident

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) on the loop soon (from any thread; nothing if the loop is gone)."""
        loop = self.loop
        if loop is None:
            return
        if self.on_loop():
            loop.call_soon(fn, *args)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fn, *args)

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run fn() on the loop and return its result (at once when called on the loop)."""
        if self.on_loop():
            return fn()
        assert self.loop is not None, "the loop is not running"
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:
                done.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout=timeout)


class HTTPServer:
    """Serves `handler` on host:port on a `LoopThread`'s loop (port 0: any free port).

    `start` listens, `stop` closes the listening socket and cuts every connection; the loop
    goes on (the controllers of a partitioned cluster keep running on it).
    """

    def __init__(self, handler: Handler, host: str, port: int, runner: LoopThread, *, idle_timeout: float = 300.0):
        self.handler = handler
        self.host = host
        self.port = port
        self.runner = runner
        self.idle_timeout = idle_timeout
        self.delay = 0.0  # seconds every request waits before it is handled
        self._conns: set[_Conn] = set()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self.runner.loop is not None
        return self.runner.loop

    def on_loop(self) -> bool:
        return self.runner.on_loop()

    def start(self) -> None:
        """Listen and serve; raises OSError (e.g. the port is taken) before returning."""
        fut = asyncio.run_coroutine_threadsafe(
            self.loop.create_server(lambda: _Conn(self), self.host, self.port, reuse_address=True, backlog=1024), self.loop
        )
        server = fut.result(timeout=30)

        def started() -> None:
            self._server = server
            self.port = server.sockets[0].getsockname()[1]
            self._sweeper = self.loop.call_later(30.0, self._sweep)

        self.runner.call(started)

    def _sweep(self) -> None:
        """Close keep-alive connections idle for longer than `idle_timeout`."""
        cutoff = time.monotonic() - self.idle_timeout
        for c in list(self._conns):
            if c.current is None and c.last_active < cutoff and c.transport is not None:
                c.transport.close()
        self._sweeper = self.loop.call_later(30.0, self._sweep)

    def stop(self) -> None:
        """Close the listening socket and cut every connection (on the loop; waits for it)."""

        def close() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            if self._sweeper is not None:
                self._sweeper.cancel()
                self._sweeper = None
            for c in list(self._conns):
                if c.transport is not None:
                    c.transport.abort()

        self.runner.call(close)
