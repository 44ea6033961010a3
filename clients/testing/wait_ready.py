"""Waits until sidecars answer, and until the first two see each other ALIVE.

    python wait_ready.py A B C     (C may require ANARCHON_C_TOKEN)
"""

import os
import sys
import time

import anarchon


def main() -> int:
    addrs = sys.argv[1:]
    deadline = time.monotonic() + 60
    token = os.environ.get("ANARCHON_C_TOKEN")
    clients = [anarchon.Client(a, token=token if i == 2 else None, timeout=2) for i, a in enumerate(addrs)]
    selves = {}
    for addr, c in zip(addrs, clients):
        while True:
            try:
                selves[addr] = c.peers().self.node
                break
            except anarchon.AnarchonError as e:
                if time.monotonic() > deadline:
                    print(f"{addr}: {e}", file=sys.stderr)
                    return 1
                time.sleep(0.1)
    if len(addrs) >= 2:
        a, b = addrs[:2]
        for me, other, c in ((a, b, clients[0]), (b, a, clients[1])):
            while not any(p.node == selves[other] and p.state == "ALIVE" for p in c.peers().peers):
                if time.monotonic() > deadline:
                    print(f"{me} does not see {other} alive", file=sys.stderr)
                    return 1
                time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
