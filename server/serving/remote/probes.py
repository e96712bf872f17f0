"""A worker host's container probes (``--health-port``): ``GET /health`` answers 200 while the
host's loop runs, ``GET /ready`` 200 while it is also joined to a head with a worker ready;
both carry that state as JSON, and 503 when it does not hold."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

from ...errors import StartupError


def serve_probes(bind: str, port: int, state: Callable[[], dict[str, Any]]) -> http.server.ThreadingHTTPServer:
    """Serve the probes on a thread of their own; ``state()`` gives ``alive``, ``joined`` and
    ``workers_ready``. Stop with ``shutdown()`` and ``server_close()``."""

    class Probe(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            now = state()
            if self.path.split("?")[0] == "/health":
                ok = now["alive"]
            elif self.path.split("?")[0] == "/ready":
                ok = now["alive"] and now["joined"] and bool(now["workers_ready"])
            else:
                self.send_error(404)
                return
            body = json.dumps(now).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would drown the log

    try:
        server = http.server.ThreadingHTTPServer((bind, port), Probe)
    except OSError as exc:
        raise StartupError(f"cannot serve health probes on {bind}:{port}: {exc.strerror}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
