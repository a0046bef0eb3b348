"""A small OpenAI-compatible chat server on 127.0.0.1 for tests that must go over real HTTP."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeChatServer:
    """Speaks /v1/chat/completions; `fail_next` makes the next N requests answer 503."""

    def __init__(self):
        self.calls = 0
        self.images = 0
        self.fail_next = 0
        self.bodies: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                """Quiet: tests read the counters, not the access log."""

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.calls += 1
                server.bodies.append(body)
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                if server.fail_next > 0:
                    server.fail_next -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                content = body["messages"][0]["content"]
                if isinstance(content, list):  # a page image for the vision-language model
                    server.images += sum(1 for part in content if part.get("type") == "image_url")
                    answer = "# Transcribed page\n\nText read from the page image by the model."
                else:
                    chunk = content.split("<chunk>")[1].split("</chunk>")[0].strip()
                    answer = f"Situated: this part covers {chunk.split()[0].strip('#')} matters."
                payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
