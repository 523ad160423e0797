#!/usr/bin/env python3
"""A migration stream proxy that corrupts fusebox's device state, for
tests/migration/run.sh --scenario corrupt (standard library only).

    corrupt-proxy.py LISTEN-SOCKET TARGET-SOCKET [OFFSET]

Listens on the unix socket LISTEN-SOCKET, takes one connection (the
source QEMU's migration), connects to TARGET-SOCKET (the destination's
-incoming socket) and forwards both directions unchanged (QEMU's return
path uses the same connection), but for one byte: in the source-to-
destination direction it looks for fusebox's device state magic
b"FUSEBOX\\x01" and flips (XOR 0xff) the byte OFFSET bytes (default 24)
after its first byte, which falls inside the state (past the magic and
the version). Reports on stderr where it found the magic and what it
flipped, and the bytes forwarded each way; exits 0 when both directions
ended and a byte was flipped, 1 when the magic never came by.
"""
import os
import socket
import sys
import threading

MAGIC = b"FUSEBOX\x01"


def log(msg):
    print(f"corrupt-proxy: {msg}", file=sys.stderr, flush=True)


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    listen_path, target_path = sys.argv[1], sys.argv[2]
    offset = int(sys.argv[3]) if len(sys.argv) == 4 else 24
    if offset < len(MAGIC):
        log("the offset must be past the magic")
        return 2
    try:
        os.unlink(listen_path)
    except FileNotFoundError:
        pass
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(listen_path)
    ls.listen(1)
    log(f"listening on {listen_path}, forwarding to {target_path}")
    src, _ = ls.accept()
    ls.close()
    dst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dst.connect(target_path)
    log("source connected; connected to the destination")

    state = {"flipped": None, "found": None}
    counts = {}

    def forward(a, b, name, corrupt):
        total = 0
        tail = b""  # the last len(MAGIC)-1 bytes seen, for a magic split across reads
        flip_at = None  # absolute stream offset of the byte to flip
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if corrupt and state["flipped"] is None:
                    if flip_at is None:
                        i = (tail + data).find(MAGIC)
                        if i >= 0:
                            start = total - len(tail) + i
                            state["found"] = start
                            flip_at = start + offset
                            log(f"magic {MAGIC!r} at stream offset {start}; flipping the byte at {flip_at}")
                        else:
                            tail = (tail + data)[-(len(MAGIC) - 1):]
                    if flip_at is not None and total <= flip_at < total + len(data):
                        buf = bytearray(data)
                        k = flip_at - total
                        ctx = bytes(buf[max(0, k - 8):k + 8]).hex()
                        old = buf[k]
                        buf[k] ^= 0xFF
                        data = bytes(buf)
                        state["flipped"] = flip_at
                        log(f"flipped byte {flip_at} from {old:#04x} to {buf[k]:#04x} (around it: {ctx})")
                b.sendall(data)
                total += len(data)
        except OSError as e:
            log(f"{name}: {e}")
        finally:
            counts[name] = total
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    t1 = threading.Thread(target=forward, args=(src, dst, "to the destination", True))
    t2 = threading.Thread(target=forward, args=(dst, src, "back to the source", False))
    t1.start()
    t2.start()
    t1.join()
    t2.join()
    log(f"done: {counts.get('to the destination', 0)} bytes to the destination, "
        f"{counts.get('back to the source', 0)} back to the source")
    if state["flipped"] is None:
        log("FAIL: the device state's magic never came by (or the stream ended before the byte to flip)")
        return 1
    return 0


sys.exit(main())
