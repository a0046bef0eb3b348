"""Small JSON-over-HTTP servers on 127.0.0.1 for tests that must go over real HTTP: an OpenAI-compatible chat
server, and the base the other endpoint fakes (rerank) build on."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that gave up (a test's timeout) closes the socket before the answer: not an error here."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class JsonServer:
    """Answers each POST with `reply(path, body)` as JSON (None: 404). `fail_next` makes the next N requests answer
    503; `calls` counts requests and `requests` keeps each (path, body)."""

    def __init__(self, base_path: str = ""):
        self.calls = 0
        self.fail_next = 0
        self.requests: list[tuple[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                """Quiet: tests read the counters, not the access log."""

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.calls += 1
                server.requests.append((self.path, body))
                if server.fail_next > 0:
                    server.fail_next -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                payload = server.reply(self.path, body)
                if payload is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{base_path}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reply(self, path: str, body: Any) -> Any:
        raise NotImplementedError

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeChatServer(JsonServer):
    """Speaks /v1/chat/completions: a page image is transcribed, a chunk gets a situating sentence."""

    def __init__(self):
        self.images = 0
        super().__init__("/v1")

    @property
    def bodies(self) -> list[dict]:
        return [body for _, body in self.requests]

    def reply(self, path: str, body: Any) -> Any:
        if path != "/v1/chat/completions":
            return None
        content = body["messages"][0]["content"]
        if isinstance(content, list):  # a page image for the vision-language model
            self.images += sum(1 for part in content if part.get("type") == "image_url")
            answer = "# Transcribed page\n\nText read from the page image by the model."
        else:
            chunk = content.split("<chunk>")[1].split("</chunk>")[0].strip()
            answer = f"Situated: this part covers {chunk.split()[0].strip('#')} matters."
        return {"choices": [{"message": {"role": "assistant", "content": answer}}]}
