"""A file server on 127.0.0.1 that holds each answer DELAY ms (Range honoured),
run as its own process so that its CPU time is not the loader's.

    python bench/slow_server.py FOLDER DELAY_MS     # prints its port; ends with stdin
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def serve(root: str, delay_ms: float) -> None:
    """Serve ``root`` on a free port of 127.0.0.1; print the port (the parent reads it)."""
    from servers import HTTPServer  # the suite's Range server (tests/servers.py)

    server = HTTPServer(root)
    server.server.delay = delay_ms / 1000
    print(server.url.rsplit(":", 1)[1], flush=True)
    # The parent holds this process's stdin: when it ends, however, so does the server.
    sys.stdin.read()
    os._exit(0)


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
