"""An OpenAI-compatible /v1/embeddings server on 127.0.0.1 serving the real packaged MiniLM model (what
text-embeddings-inference or vLLM would serve), with switches to answer 429 or serve vectors of another size."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class EmbeddingServer:
    def __init__(self, model_location: str, served_name: str = "all-MiniLM-L6-v2"):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_location, device="cpu")
        self.served_name = served_name
        self.requests = 0
        self.throttle_next = 0  # answer the next N requests with 429 and Retry-After
        self.retry_after = "1"
        self.truncate_to: int | None = None  # serve vectors of this many dimensions (another model, in effect)
        self.authorization: list[str | None] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                """Quiet: tests read the counters."""

            def _answer(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.requests += 1
                    server.authorization.append(self.headers.get("Authorization"))
                    throttled = server.throttle_next > 0
                    server.throttle_next -= throttled
                if self.path != "/v1/embeddings" or request.get("model") != server.served_name:
                    self._answer(404, {"error": {"message": f"no model {request.get('model')!r} at {self.path}"}})
                    return
                if throttled:
                    self._answer(429, {"error": {"message": "slow down"}}, {"Retry-After": server.retry_after})
                    return
                texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
                with server._lock:  # one encode at a time, as a single-GPU server would
                    vectors = server.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
                if server.truncate_to:
                    vectors = vectors[:, :server.truncate_to]
                self._answer(200, {"object": "list", "model": server.served_name, "data": [
                    {"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
