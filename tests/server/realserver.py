"""The real server as a subprocess (`python -m engine.cli serve`) and a raw HTTP/1.1 client for the
cases httpx cannot send (pipelining, conflicting framing headers, slow bodies)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
SMALL_POOL = ["--max-num-seqs", "4", "--max-waiting-requests", "8", "--num-gpu-blocks-override", "40"]


class Server:
    def __init__(
        self, tmp: Path, *args: str, ready_timeout_s: float = 180, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "server.log"
        self._log = self.log_path.open("w")
        cmd = [sys.executable, "-m", "engine.cli", "serve", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        deadline = time.monotonic() + ready_timeout_s
        while True:
            assert self.proc.poll() is None, self.log()[-3000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.25)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def metrics(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return {
            s.name: s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if not s.labels
        }

    def wait_pools_empty(self, timeout_s: float = 10.0) -> dict[str, float]:
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            busy = m["deltaserve_kv_blocks_used"] + m["deltaserve_state_slots_used"]
            busy += m["deltaserve_num_requests_running"] + m["deltaserve_num_requests_waiting"]
            if busy == 0:
                return m
            assert time.monotonic() < deadline, f"pools not empty after {timeout_s} s: {m}"
            time.sleep(0.1)


def request_bytes(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> bytes:
    """One HTTP/1.1 request; a dict/list body is sent as JSON (json.dumps escapes lone surrogates)."""
    raw = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(raw)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + raw


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


class RawConn:
    """A blocking socket that reads Content-Length-framed responses one after another."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        host, port = url.rsplit("/", 1)[1].split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.buf = b""

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def read_response(self) -> RawResponse | None:
        """The next response, or None when the server closed the connection first."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                return None
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            return RawResponse(status, headers, self._read_chunked())
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            if not self._fill():
                break
        body, self.buf = self.buf[:length], self.buf[length:]
        return RawResponse(status, headers, body)

    def _read_chunked(self) -> bytes:
        body = b""
        while True:
            while b"\r\n" not in self.buf:
                if not self._fill():
                    return body
            size_line, self.buf = self.buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(self.buf) < size + 2:
                if not self._fill():
                    return body + self.buf
            body, self.buf = body + self.buf[:size], self.buf[size + 2 :]
            if size == 0:
                return body

    def closed_by_peer(self) -> bool:
        """True when the server closes the connection (after any buffered response bytes)."""
        try:
            return not self.buf and not self._fill()
        except (ConnectionResetError, TimeoutError):
            return True
