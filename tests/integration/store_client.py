#!/usr/bin/env python3
"""store_client.py HOST PORT [SOURCE_ADDR] - a client that speaks the TCPStore
protocol as PyTorch's does (VALIDATE, PING) and holds no token. Prints "pong"
when the store answered, "closed after N bytes" when it closed the connection,
"silent" when nothing came within 5 s. Exit 0 in every case but a failed connect."""
import socket, struct, sys

host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
if len(sys.argv) > 3:
    s.bind((sys.argv[3], 0))
s.settimeout(5)
s.connect((host, port))
s.sendall(struct.pack("=BI", 0, 0x3C85F7CE) + struct.pack("=BI", 13, 0xBEEF))
got = b""
try:
    while len(got) < 4:
        b = s.recv(4 - len(got))
        if not b:
            break
        got += b
except socket.timeout:
    print("silent")
    sys.exit(0)
except ConnectionResetError:
    pass
if got == struct.pack("=I", 0xBEEF):
    print("pong")
else:
    print("closed after %d bytes" % len(got))
