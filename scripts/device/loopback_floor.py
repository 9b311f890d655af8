#!/usr/bin/env python3
"""The floor of moving an N-byte HTTP body over loopback TCP on this host.

A server thread answers each request line with a ready-made response of
N bytes (no work per request); the client sends a request, reads the whole
response and times it. JSON on stdout: p50/p90/min in ms for each size.
With QUANTEM_FLOOR_SOCKET_BUFFER=BYTES both ends set SO_SNDBUF/SO_RCVBUF to
that size (the daemon's --socket-buffer question: does one write fit?).
"""
import os
import json
import socket
import sys
import threading
import time


SOCKET_BUFFER = int(os.environ.get("QUANTEM_FLOOR_SOCKET_BUFFER", "0"))


def serve(listener, body_sizes):
    bodies = {n: (b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n) + b"\0" * n for n in body_sizes}
    connection, _ = listener.accept()
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if SOCKET_BUFFER:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    pending = b""
    while True:
        chunk = connection.recv(65536)
        if not chunk:
            return
        pending += chunk
        while b"\r\n\r\n" in pending:
            request, pending = pending.split(b"\r\n\r\n", 1)
            size = int(request.split(b" ")[1].lstrip(b"/"))
            connection.sendall(bodies[size])


def main():
    sizes = [int(s) for s in (sys.argv[1:] or ["0", "147456", "1048576"])]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    threading.Thread(target=serve, args=(listener, sizes), daemon=True).start()
    client = socket.create_connection(listener.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if SOCKET_BUFFER:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    buffer = bytearray(4 << 20)
    view = memoryview(buffer)
    report = {}
    for size in sizes:
        times = []
        for _ in range(200):
            start = time.perf_counter()
            client.sendall(b"GET /%d HTTP/1.1\r\nhost: x\r\n\r\n" % size)
            received = 0
            header_end = -1
            while header_end < 0 or received < header_end + 4 + size:
                received += client.recv_into(view[received:])
                if header_end < 0:
                    header_end = bytes(view[:received]).find(b"\r\n\r\n")
            times.append((time.perf_counter() - start) * 1e3)
        times = sorted(times[20:])
        report[str(size)] = {"p50": times[len(times) // 2], "p90": times[int(len(times) * 0.9)], "min": times[0]}
    print(json.dumps(report))


main()
