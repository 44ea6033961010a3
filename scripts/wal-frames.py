#!/usr/bin/env python3
"""What the SQLite writer writes to the WAL, per batch and per claim.

Reads an strace log of the `anarchon serve` process's SQLite writer thread
and runtime worker thread(s), taken while a bench drives it (since round 20
the writer runs on the runtime worker: trace that one thread):

    strace -p WRITER_TID -p WORKER_TID -e trace=pwrite64,fcntl,recvfrom \
        -x -s 8 -o writer.txt        # for a second or so, then Ctrl-C
    scripts/wal-frames.py writer.txt

A batch is one hold of the WAL write lock (the `fcntl` write lock at byte
120 of the `-shm` file, taken and released). Each WAL frame is two
`pwrite64` calls: its 24-byte header, whose first four bytes are the page
number, then the page, whose first byte is the page type (0x0a an index
leaf, 0x02 an index interior page: `WITHOUT ROWID` tables are index
B-trees; 0x0d and 0x05 the same for rowid tables). Each `recvfrom` that
returned data on a worker is counted as one request (one claim, with the
bench's one request in flight per connection).

Prints the batches, the requests, and per batch the frames by kind
(docs/BENCHMARKS.md, round 19).
"""

import collections
import re
import sys

KINDS = {0x0A: "leaf", 0x02: "interior", 0x0D: "table leaf", 0x05: "table interior"}
WRITE = re.compile(r'pwrite64\(\d+, "((?:\\x[0-9a-f]{2}|[^"\\])*)"(?:\.\.\.)?, (\d+),')
BYTE = re.compile(r"\\x([0-9a-f]{2})|(.)")


def first_bytes(escaped):
    return [int(h, 16) if h else ord(c) for h, c in BYTE.findall(escaped)]


def main(path):
    batches, batch, page, requests, written = [], None, None, 0, 0
    with open(path) as log:
        for line in log:
            if "recvfrom(" in line and "= -1" not in line and "resumed" not in line:
                requests += 1
            elif "l_start=120" in line and "F_WRLCK" in line:
                batch = []
            elif "l_start=120" in line and "F_UNLCK" in line:
                if batch is not None:
                    batches.append(batch)
                batch = None
            elif batch is not None and (m := WRITE.search(line)):
                head, size = first_bytes(m.group(1)), int(m.group(2))
                written += size
                if size == 24:
                    page = int.from_bytes(bytes(head[:4]), "big")
                elif head:
                    kind = "page 1" if page == 1 else KINDS.get(head[0], "other")
                    batch.append(kind)
    if not batches:
        sys.exit(f"{path}: no WAL write lock taken and released (is the writer traced?)")
    frames = sum(len(b) for b in batches)
    kinds = collections.Counter(k for b in batches for k in b)
    n = len(batches)
    print(f"batches {n}, requests {requests}, frames {frames}, bytes written {written}")
    print(f"per batch: {frames / n:.1f} frames, " + ", ".join(
        f"{k} {v / n:.2f}" for k, v in kinds.most_common()))
    if requests:
        print(f"per request: {requests / n:.1f} requests per batch, "
              f"{frames / requests:.2f} frames, {written / requests:.0f} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
