"""A fixed number of HTTP `/pub` requests to a fresh nsqd, with AUTH required or without, to be
timed as whole processes against each other:

    farm-bench -n 9 --timeout 900 \\
        --vs ".venv/bin/python -m bench.http_auth_pub plain 60000" \\
        -- .venv/bin/python -m bench.http_auth_pub auth 60000

`auth` starts nsqd with `--auth-http-address` (an auth server in this process granting
`publish` and `subscribe` for an hour, `bench.http_pub.start_auth_server`) and
`--http-auth-required`, and every request carries `Authorization: Bearer`; `plain` starts it
without either. The load is 32 keep-alive connections, one request outstanding on each, from
one process; every answer must be `200 OK`. nsqd's CPU seconds are printed at the end (it is
stopped with SIGKILL and reaped, so a parent's accounting includes it).
"""

import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile

from bench.http_pub import AUTH_SECRET, start_auth_server

CONNECTIONS = 32
_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def start_nsqd(auth: bool) -> tuple[subprocess.Popen, int]:
    args = [
        os.path.join(os.path.dirname(sys.executable), "nsqd"),
        "-tcp-address=127.0.0.1:0",
        "-http-address=127.0.0.1:0",
        f"-data-path={tempfile.mkdtemp(prefix='nsqpy-bench-')}",
    ]
    if auth:
        args += [f"-auth-http-address=127.0.0.1:{start_auth_server()}", "-http-auth-required"]
    process = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"HTTP: listening on 127.0.0.1:(\d+)", line)
        if found:
            return process, int(found.group(1))
    raise RuntimeError(f"nsqd exited: {process.wait()}")


def publish(port: int, total: int, auth: bool) -> None:
    credential = f"Authorization: Bearer {AUTH_SECRET}\r\n" if auth else ""
    request = (
        f"POST /pub?topic=bench HTTP/1.1\r\nHost: 127.0.0.1\r\n{credential}"
        "Content-Length: 5\r\n\r\nhello"
    ).encode()
    selector = selectors.DefaultSelector()
    sent = answered = 0
    for _ in range(CONNECTIONS):
        connection = socket.create_connection(("127.0.0.1", port))
        connection.setblocking(False)
        connection.send(request)
        sent += 1
        selector.register(connection, selectors.EVENT_READ, bytearray())
    while answered < total:
        for key, _events in selector.select():
            connection, buffer = key.fileobj, key.data
            buffer += connection.recv(65536)
            while (end_of_headers := buffer.find(b"\r\n\r\n")) >= 0:
                length = _CONTENT_LENGTH.search(buffer, 0, end_of_headers + 2)
                end = end_of_headers + 4 + int(length.group(1) if length else 0)
                if len(buffer) < end:
                    break
                if not buffer.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(bytes(buffer[:200]).decode("latin-1"))
                del buffer[:end]
                answered += 1
                if sent < total:
                    connection.send(request)
                    sent += 1


def main() -> None:
    mode, total = sys.argv[1], int(sys.argv[2])
    if mode not in ("auth", "plain"):
        raise SystemExit("usage: python -m bench.http_auth_pub auth|plain REQUESTS")
    process, port = start_nsqd(mode == "auth")
    try:
        publish(port, total, mode == "auth")
        with open(f"/proc/{process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        print(f"{mode}: {total} requests answered 200; nsqd CPU {cpu:.2f} s")
    finally:
        process.kill()
        process.wait()


if __name__ == "__main__":
    main()
