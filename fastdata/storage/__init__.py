"""One storage layer under every format: a path or URL (s3://, gs://, az://,
http(s)://, file://, plain paths) turned into reads, ranged reads, cached local
copies and atomic uploads. Object stores through obstore, imported only when
such a URL is used, so ``import fastdata`` stays light; http(s) through the
standard library (fastdata.storage.http), which keeps to the URL's host.
"""

from fastdata.errors import StorageError
from fastdata.storage.cache import ShardCache
from fastdata.storage.objects import (
    RemoteObject,
    create_bytes,
    delete,
    exists,
    list_names,
    list_tree,
    open_remote,
    upload_bytes,
    upload_file,
)
from fastdata.storage.urls import basename, dirname, is_url, join, local_path

__all__ = [
    "RemoteObject", "ShardCache", "StorageError", "basename", "create_bytes", "delete",
    "dirname", "exists", "is_url", "join", "list_names", "list_tree", "local_path",
    "open_remote", "upload_bytes", "upload_file",
]
