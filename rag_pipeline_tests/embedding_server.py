"""An OpenAI-compatible /v1/embeddings server on 127.0.0.1 serving the real packaged MiniLM model (what
text-embeddings-inference or vLLM would serve), with switches to answer 429 or serve vectors of another size.
`EmbeddingServer.stand_in()` serves feature-hashed vectors instead, at thousands of texts a second: a GPU fleet's
stand-in for benchmarks that measure the pipeline's own cost at sizes two CPU cores could not embed."""

from __future__ import annotations

import functools
import json
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


def hashed_vectors(texts: list[str], dimensions: int = 384) -> np.ndarray:
    """Unit vectors of signed word counts hashed into `dimensions` (texts sharing words are near each other)."""
    vectors = np.zeros((len(texts), dimensions), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().split():
            code = zlib.crc32(word.encode())
            vectors[row, code % dimensions] += 1.0 if code & 0x80000000 else -1.0
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


class EmbeddingServer:
    def __init__(self, model_location: str | None, served_name: str = "all-MiniLM-L6-v2",
                 encode: Callable[[list[str]], np.ndarray] | None = None):
        if encode is None:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(model_location, device="cpu")
            encode = lambda texts: model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)  # noqa: E731
        self.served_name = served_name
        self.models: dict[str, Callable[[list[str]], np.ndarray]] = {served_name: encode}  # name -> its vectors
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
                encode = server.models.get(request.get("model"))
                if self.path != "/v1/embeddings" or encode is None:
                    self._answer(404, {"error": {"message": f"no model {request.get('model')!r} at {self.path}"}})
                    return
                if throttled:
                    self._answer(429, {"error": {"message": "slow down"}}, {"Retry-After": server.retry_after})
                    return
                texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
                with server._lock:  # one encode at a time, as a single-GPU server would
                    vectors = encode(texts)
                if server.truncate_to:
                    vectors = vectors[:, :server.truncate_to]
                self._answer(200, {"object": "list", "model": request["model"], "data": [
                    {"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @classmethod
    def stand_in(cls, served_name: str, dimensions: int = 384, **others: int) -> EmbeddingServer:
        """Hashed vectors under `served_name`, and under each of `others` (name=dimensions: other models, for a
        swap)."""
        server = cls(None, served_name, encode=functools.partial(hashed_vectors, dimensions=dimensions))
        for name, size in others.items():
            server.models[name] = functools.partial(hashed_vectors, dimensions=size)
        return server

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    """`python -m rag_pipeline_tests.embedding_server --stand-in NAME=DIMENSIONS ...`: serve the stand-in in its
    own process (not under the measured pipeline's interpreter lock), print its URL on one line, and serve until
    stopped or orphaned."""
    import argparse
    import os
    import signal

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--stand-in", required=True, action="append", metavar="NAME=DIMENSIONS",
                        help="a model name it serves and its vectors' size (repeat for more models)")
    args = parser.parse_args()
    models = {name: int(size) for name, _, size in (spec.rpartition("=") for spec in args.stand_in)}
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # before the server's threads start: they inherit it
    first = next(iter(models))
    server = EmbeddingServer.stand_in(first, models.pop(first), **models)
    print(server.url, flush=True)
    parent = os.getppid()
    while os.getppid() == parent and signal.sigtimedwait(stop_signals, 1.0) is None:
        pass  # until told to stop, or until the process that started it is gone
    server.stop()


if __name__ == "__main__":
    main()
