"""The storage helper process's side (see fastdata.storage.forked): requests
read from its pipe, run with fastdata.storage.objects in this fresh process,
and the results (or the exception raised) sent back.
"""

from __future__ import annotations

import sys

from fastdata.storage import objects
from fastdata.storage.forked import receive, send

#: Operation name -> what it runs; a request is (name, arguments).
OPS = {
    "size": lambda url, opts: objects.RemoteObject(url, opts).size(),
    "read": lambda url, opts, limit=None: objects.RemoteObject(url, opts).read(limit=limit),
    "read_ranges": lambda url, opts, ranges, coalesce=None:
        objects.RemoteObject(url, opts).read_ranges(ranges, coalesce=coalesce),
    "download": lambda url, opts, dest, limit=None, size=None:
        objects.RemoteObject(url, opts).download(dest, limit=limit, size=size),
    "exists": lambda url, opts: objects.exists(url, opts),
    "list_names": lambda url, opts: objects.list_names(url, opts),
    "upload_file": lambda url, opts, local: objects.upload_file(local, url, opts),
    "upload_bytes": lambda url, opts, data: objects.upload_bytes(data, url, opts),
    "delete": lambda url, opts: objects.delete(url, opts),
    "first_bytes": lambda url, opts, size: objects.RemoteObject(url, opts).first_bytes(size),
    "create_bytes": lambda url, opts, data: objects.create_bytes(data, url, opts),
    "list_tree": lambda url, opts: objects.list_tree(url, opts),
}


def serve() -> None:
    """The helper's loop: one request at a time until the pipe closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        request = receive(stdin)
        if request is None:
            return
        op, args = request
        try:
            reply = (True, OPS[op](*args))
        except Exception as exc:  # sent back and raised in the asking process
            reply = (False, exc)
        send(stdout, reply)
