"""MCP servers for the tests: the SDK-written `server.py`, over stdio inside the sandbox
(one process per test's application) and over streamable HTTP on 127.0.0.1 (one process
per test module)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SERVER = Path(__file__).with_name("server.py")
# The sandboxed server runs this venv's python: its install and packages must be readable.
PYTHON_PATHS = sorted({sys.prefix, sys.base_prefix})


def stdio_server(**settings: Any) -> dict[str, Any]:
    """`[mcp.servers.<name>]` for `server.py` over stdio (`args`: more argv)."""
    args = settings.pop("args", [])
    return {
        "command": [sys.executable, str(SERVER), *args],
        "read_paths": PYTHON_PATHS,
        "timeout_seconds": 20,
        **settings,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, proc: subprocess.Popen[bytes], limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`server.py` over streamable HTTP on 127.0.0.1, shared by a module's tests; its
    URL."""
    port = free_port()
    where = tmp_path_factory.mktemp("http-server")
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)],
        cwd=where,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()
