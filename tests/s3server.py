"""A real S3-compatible server for the tests, and a proxy that breaks requests on purpose.

``MotoServer`` runs moto's standalone S3 server (``python -m moto.server``) in a subprocess
on 127.0.0.1; nothing in boto3 is mocked. ``FaultProxy`` sits between flor and that server
and, for a chosen fraction of HTTP requests, drops the connection before forwarding, drops
it after the server acted (the client never hears back), answers ``503 SlowDown``, or flips
one byte of an object's bytes on the way up or down. It counts what it did, so a test can
prove that every fault was survived and report how many there were.
"""

from __future__ import annotations

import os
import random
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

ACCESS_KEY = "AKIAFLORTESTKEY00001"
SECRET_KEY = "flor-test-secret-Zq8vN3xW-never-stored"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """moto's S3 server in a subprocess; ``auth=True`` makes it check credentials."""

    def __init__(self, *, auth: bool = False) -> None:
        self.port = free_port()
        self.auth = auth
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "MotoServer":
        env = dict(os.environ)
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"  # check every request's credentials
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=0.5).read()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self):  # noqa: ANN201 - a boto3 client, for checking what the bucket holds
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` with its bytes."""
        c = self.client()
        out = {}
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", ()):
                out[o["Key"]] = c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return out


_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


@dataclass
class FaultProxy:
    """Forward HTTP/1.1 requests to ``upstream`` one connection each, breaking some of them."""

    upstream: int
    drop: float = 0.0  # close the connection without forwarding
    drop_after: float = 0.0  # forward, let the server act, then close without answering
    slowdown: float = 0.0  # answer 503 SlowDown without forwarding
    corrupt: float = 0.0  # flip one byte of an object body going up (PUT) or down (GET)
    delay: float = 0.0  # seconds to wait before forwarding each request
    seed: int = 0
    counts: Counter = field(default_factory=Counter)
    puts: list = field(default_factory=list)  # paths of the PUTs that reached the server

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def failed(self) -> int:
        """Requests that did not get through intact."""
        return sum(self.counts[k] for k in ("dropped", "dropped_after", "slowdown", "corrupted"))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _choose(self, method: str, path: str) -> str:
        with self._lock:
            r = self._rng.random()
        for fault, p in (("dropped", self.drop), ("slowdown", self.slowdown), ("dropped_after", self.drop_after),
                         ("corrupted", self.corrupt)):
            if r < p:
                return fault
            r -= p
        return "ok"

    def _handle(self, client: socket.socket) -> None:
        client.settimeout(30)
        try:
            head, body = _read_request(client)
        except (OSError, ValueError):
            return
        if head is None:
            return
        request_line, headers = head
        method, path, _ = request_line.split(" ", 2)
        if headers.get("expect", "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = _read_exact(client, int(headers.get("content-length", 0)))
        fault = self._choose(method, path) if "/moto-api" not in path else "ok"
        object_body = "?" not in path or "partNumber=" in path
        if fault == "corrupted" and not ((method == "PUT" and body) or (method == "GET" and object_body)):
            fault = "ok"  # only object bytes are damaged: listings and headers stay intact
        with self._lock:
            self.counts["requests"] += 1
            self.counts[fault] += 1
        if fault == "dropped":
            client.close()
            return
        if fault == "slowdown":
            client.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                           + f"Content-Length: {len(_SLOWDOWN)}\r\n\r\n".encode() + _SLOWDOWN)
            client.close()
            return
        if self.delay:
            time.sleep(self.delay)
        if fault == "corrupted" and method == "PUT":
            body = _flip(body)
        lines = [request_line] + [f"{k}: {v}" for k, v in headers.items()
                                  if k not in ("connection", "expect", "keep-alive")] + ["connection: close"]
        try:
            with socket.create_connection(("127.0.0.1", self.upstream), timeout=30) as up:
                up.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
                response = _read_all(up)
        except OSError:
            client.close()
            return
        if method == "PUT":
            with self._lock:
                self.puts.append(path.split("?")[0])
        if fault == "dropped_after":
            client.close()
            return
        rhead, sep, rbody = response.partition(b"\r\n\r\n")
        if fault == "corrupted" and method == "GET":
            rbody = _flip(rbody)
        rlines = [ln for ln in rhead.split(b"\r\n") if not ln.lower().startswith((b"connection:", b"keep-alive:"))]
        try:
            client.sendall(b"\r\n".join(rlines + [b"Connection: close"]) + sep + rbody)
        except OSError:
            pass
        client.close()


def _flip(data: bytes) -> bytes:
    if not data:
        return data
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]


def _read_exact(sock: socket.socket, n: int, buf: bytes = b"") -> bytes:
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ValueError("connection closed mid-body")
        buf += chunk
    return buf


def _read_request(sock: socket.socket) -> tuple[tuple[str, dict] | None, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        buf += chunk
    raw, _, rest = buf.partition(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        raise ValueError("chunked request bodies are not supported by this test proxy")
    if headers.get("expect", "").lower() == "100-continue" and not rest:
        return (lines[0], headers), b""
    return (lines[0], headers), _read_exact(sock, int(headers.get("content-length", 0)), rest)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def s3_env(runner, endpoint: str, spool: str | None = None, **extra: str) -> dict[str, str]:  # noqa: ANN001
    """The environment of a process that talks to the test server, isolated from any real AWS setup
    (``runner``: a ``helpers.Runner``)."""
    env = runner.env(**{"FLOR_EVERY": "1", **extra})  # a checkpoint every epoch, whatever the timing
    for key in [k for k in env if k.startswith("AWS_")]:
        del env[key]
    env.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION=REGION,
        AWS_ENDPOINT_URL_S3=endpoint, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    if spool:
        env["FLOR_SPOOL"] = spool
    return env
