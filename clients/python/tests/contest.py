"""Contest claimer (run by clients/test.sh, not by pytest): one thread per
sidecar claims slot i of CONTEST_JOB at CONTEST_START_MS + 30 ms * i, prints
one line per claim ("python <sidecar> <slot> <OUTCOME> <attempt>") and
releases what it won."""

import os
import sys
import threading
import time

import anarchon

STEP_MS = 30


def worker(name, addr, job, base, n, start_ms, out, lock):
    with anarchon.Client(addr, timeout=30) as c:
        c.peers()  # connect before the start
        for i in range(n):
            slot = base + i
            # Every claimer fires slot i at the same moment.
            time.sleep(max(0, (start_ms + i * STEP_MS) / 1000 - time.time()))
            try:
                r = c.claim(job, slot)
                line = f"python {name} {slot} {r.outcome} {r.attempt}"
                if r.won:
                    c.release(r)
            except anarchon.AnarchonError as e:
                line = f"python {name} {slot} ERROR {e}"
            with lock:
                out.append(line)


def main():
    job = os.environ["CONTEST_JOB"]
    base, n = int(os.environ["CONTEST_BASE"]), int(os.environ["CONTEST_SLOTS"])
    start = int(os.environ["CONTEST_START_MS"])
    out, lock = [], threading.Lock()
    threads = [threading.Thread(target=worker, args=(name, os.environ[var], job, base, n, start, out, lock))
               for name, var in (("A", "ANARCHON_A"), ("B", "ANARCHON_B"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sys.stdout.write("".join(line + "\n" for line in out))


if __name__ == "__main__":
    main()
