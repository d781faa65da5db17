"""A file server on 127.0.0.1 that holds each answer DELAY ms (Range honoured),
run as its own process so that its CPU time is not the loader's.

    python bench/slow_server.py FOLDER DELAY_MS     # prints its port; ends with stdin
"""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
import time


class SlowHandler(http.server.SimpleHTTPRequestHandler):
    """Files of the served folder, each answer held ``server.delay`` seconds;
    HEAD, and GET with ``Range: bytes=A-B`` / ``A-`` / ``-N`` (206, 416)."""

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._send(body=False)

    def do_GET(self) -> None:
        self._send(body=True)

    def _send(self, body: bool) -> None:
        time.sleep(self.server.delay)
        path = os.path.join(self.directory, self.path.split("?", 1)[0].lstrip("/"))
        if ".." in self.path or not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start, end, status = 0, size - 1, 200
        asked = self.headers.get("Range")
        if asked:
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", asked)
            if not match or not (match.group(1) or match.group(2)):
                self.send_error(416)
                return
            if match.group(1):
                start = int(match.group(1))
                end = min(int(match.group(2)), end) if match.group(2) else end
            else:
                start = max(0, size - int(match.group(2)))
            if start > end or start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if body:
            with open(path, "rb") as f:
                f.seek(start)
                self.wfile.write(f.read(end - start + 1))


class SlowServer(http.server.ThreadingHTTPServer):
    # The listen backlog: socketserver's 5 makes a reader's sixth connection at
    # once wait a second for a SYN retry.
    request_queue_size = 256
    daemon_threads = True


def serve(root: str, delay_ms: float) -> None:
    """Serve ``root`` on a free port of 127.0.0.1; print the port (the parent reads it)."""
    server = SlowServer(("127.0.0.1", 0), lambda *a, **k: SlowHandler(*a, directory=root, **k))
    server.delay = delay_ms / 1000
    print(server.server_address[1], flush=True)
    # The parent holds this process's stdin: when it ends, however, so does the server.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    server.serve_forever()


def start_server(root: str, delay_ms: float) -> tuple[subprocess.Popen, int]:
    """Start :func:`serve` in a process of its own; (the process, its port)."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), root, str(delay_ms)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        sys.exit("slow_server: the HTTP server did not start")
    return proc, int(line)


if __name__ == "__main__":
    serve(sys.argv[1], float(sys.argv[2]))
