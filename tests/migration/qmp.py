#!/usr/bin/env python3
"""A minimal QMP client for tests/migration/run.sh (standard library only).

    qmp.py SOCKET COMMAND [JSON-ARGUMENTS]

Connects to QEMU's QMP unix socket, negotiates (qmp_capabilities), runs
COMMAND and prints its "return" value as JSON on one line. Exits 1 and
prints the error's class and description when QEMU answers with an
error, 2 when the socket cannot be used. Events are skipped.
"""
import json
import socket
import sys


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path, cmd = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) == 4 else None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(path)
    except OSError as e:
        print(f"qmp: connect {path}: {e}", file=sys.stderr)
        return 2
    f = s.makefile("rw", encoding="utf-8")

    def reply():
        while True:
            line = f.readline()
            if not line:
                raise EOFError("QMP connection closed")
            msg = json.loads(line)
            if "event" in msg:
                continue
            return msg

    try:
        greeting = reply()
        if "QMP" not in greeting:
            print(f"qmp: unexpected greeting {greeting}", file=sys.stderr)
            return 2
        for c, a in (("qmp_capabilities", None), (cmd, args)):
            req = {"execute": c}
            if a is not None:
                req["arguments"] = a
            f.write(json.dumps(req) + "\n")
            f.flush()
            msg = reply()
            if "error" in msg:
                err = msg["error"]
                print(f"{err.get('class')}: {err.get('desc')}")
                return 1
        print(json.dumps(msg.get("return")))
        return 0
    except (OSError, EOFError, ValueError) as e:
        # quit: QEMU may close the socket before or after its answer.
        if cmd == "quit":
            print("{}")
            return 0
        print(f"qmp: {cmd}: {e}", file=sys.stderr)
        return 2


sys.exit(main())
