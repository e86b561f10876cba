#!/usr/bin/env python3
"""store_attack.py - a hostile client of `dtrun store`, speaking the TCPStore wire
protocol over raw sockets, for tests/integration/test_store_limits.sh.

  store_attack.py set PORT KEY VALUE         one SET, as any stranger could
  store_attack.py rss PID PORT SCENARIO      runs one attack on the store (process
        PID) and prints "SCENARIO before=KB peak=KB after=KB" from /proc/PID/status:
          fill       SETs of 8 MiB values until the store closes the connection
          pingflood  PINGs for 3 s without ever reading a reply
          prevalid   300 connections that send a partial frame instead of VALIDATE
  store_attack.py idle PORT N SECONDS        opens N connections that send nothing,
        then (while they are open) a legitimate client's SET/GET round trip;
        prints "legit ok" or "legit failed: why"
"""
import socket
import struct
import sys
import time

MAGIC = 0x3C85F7CE


def frame_validate():
    return struct.pack("<BI", 0, MAGIC)


def frame_set(key, value):
    k = key.encode()
    return struct.pack("<BQ", 1, len(k)) + k + struct.pack("<Q", len(value)) + value


def frame_get(key):
    k = key.encode()
    return struct.pack("<BQ", 3, len(k)) + k


def frame_ping(nonce):
    return struct.pack("<BI", 13, nonce)


def connect(port, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def vmrss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def recv_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def legit_round_trip(port, key=b"legit"):
    s = connect(port)
    s.sendall(frame_validate() + frame_set("legit", key) + frame_get("legit"))
    n = struct.unpack("<Q", recv_exact(s, 8))[0]
    v = recv_exact(s, n)
    s.close()
    return v == key


def attack_fill(port, peak):
    s = connect(port, timeout=10)
    s.sendall(frame_validate())
    value = b"\0" * (8 << 20)
    for i in range(80):  # 640 MiB: past the limit, not past the machine
        try:
            s.sendall(frame_set("fill/%d" % i, value) + frame_ping(i))
            recv_exact(s, 4)
        except (OSError, ConnectionError):
            break
        peak()
    s.close()
    return i


def attack_pingflood(port, peak):
    s = connect(port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(frame_validate())
    s.setblocking(False)
    chunk = frame_ping(7) * 13000
    sent, at, end = 0, 0, time.time() + 3
    while time.time() < end:
        try:
            r = s.send(chunk[at:])
            sent += r
            at = (at + r) % len(chunk)
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            break
        peak()
    s.close()
    return sent


def attack_prevalid(port, peak):
    socks = []
    header = struct.pack("<BQ", 11, 128 * 1024) + struct.pack("<Q", 1) + b"k" + \
        struct.pack("<Q", 8 << 20)
    filler = b"\0" * (2 << 20)
    for _ in range(300):
        s = connect(port)
        s.setblocking(False)
        try:
            s.send(header)
            s.send(filler)
        except OSError:
            pass
        socks.append(s)
        peak()
    time.sleep(1)
    peak()
    for s in socks:
        s.close()
    return len(socks)


def main():
    cmd = sys.argv[1]
    if cmd == "set":
        port, key, value = int(sys.argv[2]), sys.argv[3], sys.argv[4].encode()
        s = connect(port)
        s.sendall(frame_validate() + frame_set(key, value) + frame_ping(1))
        recv_exact(s, 4)
        s.close()
        return 0
    if cmd == "rss":
        pid, port, scenario = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        before = vmrss_kb(pid)
        high = [before]

        def peak():
            high[0] = max(high[0], vmrss_kb(pid))

        what = {"fill": attack_fill, "pingflood": attack_pingflood,
                "prevalid": attack_prevalid}[scenario](port, peak)
        time.sleep(1)
        peak()
        ok = legit_round_trip(port)
        after = vmrss_kb(pid)
        print("%s before=%d peak=%d after=%d work=%d legit=%s" %
              (scenario, before, high[0], after, what, "ok" if ok else "failed"))
        return 0
    if cmd == "idle":
        port, n, hold = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        socks = []
        for _ in range(n):
            try:
                socks.append(connect(port, timeout=2))
            except OSError:
                break
        time.sleep(hold)
        try:
            ok = legit_round_trip(port)
            print("legit ok" if ok else "legit failed: wrong value")
        except (OSError, ConnectionError) as e:
            print("legit failed: %s" % e)
        for s in socks:
            s.close()
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
