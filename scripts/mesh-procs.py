#!/usr/bin/env python3
"""Real-process mesh run (issue 20): N `anarchon serve` processes on this
machine, each told only the first one's address, one shared SQLite store.

Waits until every process lists every other ALIVE, lets the mesh settle,
then measures for WINDOW seconds per process: CPU (utime + stime from
/proc/PID/stat), sync bytes sent (`sent_bytes` of /api/v1/mesh/state) and
links. Then SIGKILLs one process and records when each other one first lists
it EXPIRED (polled every 50 ms), against the bounds expiry − 1 heartbeat and
expiry + one heartbeat per relay hop.

    scripts/mesh-procs.py BIN N [HEARTBEAT_MS EXPIRY_MS MAX_LINKS WINDOW_S]
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

BIN = sys.argv[1]
N = int(sys.argv[2])
HB = int(sys.argv[3]) if len(sys.argv) > 3 else 500
EXPIRY = int(sys.argv[4]) if len(sys.argv) > 4 else 5000
MAX_LINKS = int(sys.argv[5]) if len(sys.argv) > 5 else 8
WINDOW = float(sys.argv[6]) if len(sys.argv) > 6 else 30.0
BASE = 23000
TICK = os.sysconf("SC_CLK_TCK")


def state(i):
    url = f"http://127.0.0.1:{BASE + 1000 + i}/api/v1/mesh/state"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def main():
    root = tempfile.mkdtemp(prefix="mesh-procs-")
    db = f"sqlite://{root}/shared.db"
    procs = []
    try:
        for i in range(N):
            args = [
                BIN, "serve",
                "--listen", f"127.0.0.1:{BASE + i}",
                "--admin-listen", f"127.0.0.1:{BASE + 1000 + i}",
                "--data-dir", f"{root}/n{i}",
                "--backend", db,
                "--heartbeat-ms", str(HB), "--expiry-ms", str(EXPIRY),
                "--max-links", str(MAX_LINKS),
            ]
            if i > 0:
                args += ["--peer", f"127.0.0.1:{BASE}"]
            log = open(f"{root}/n{i}.log", "w")
            procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log,
                                          env={**os.environ, "RUST_LOG": "warn"}))
            time.sleep(0.05)
        start = time.time()
        nodes = [None] * N
        while True:
            time.sleep(1)
            try:
                states = [state(i) for i in range(N)]
            except Exception:
                continue
            nodes = [s["self"]["node"] for s in states]
            alive = [sum(1 for p in s["peers"] if p["state"] == "ALIVE") for s in states]
            if min(alive) >= N - 1:
                break
            if time.time() - start > 180:
                print(f"mesh did not form in 180 s: alive counts {sorted(alive)}")
                return 1
        formed = time.time() - start
        print(f"{N} processes, heartbeat {HB} ms, expiry {EXPIRY} ms, max_links {MAX_LINKS}: "
              f"every one lists the {N - 1} others ALIVE after {formed:.1f} s")
        time.sleep(10 * HB / 1000)
        c0 = [cpu_s(p.pid) for p in procs]
        b0 = [s["sent_bytes"] for s in (state(i) for i in range(N))]
        t0 = time.time()
        time.sleep(WINDOW)
        dt = time.time() - t0
        c1 = [cpu_s(p.pid) for p in procs]
        sts = [state(i) for i in range(N)]
        b1 = [s["sent_bytes"] for s in sts]
        links = sorted(len(s["links"]) for s in sts)
        cpu = sorted(100 * (b - a) / dt for a, b in zip(c0, c1))
        kib = sorted((b - a) / dt / 1024 for a, b in zip(b0, b1))
        print(f"links per process: min {links[0]} p50 {links[N // 2]} max {links[-1]} "
              f"mean {sum(links) / N:.1f}")
        print(f"CPU % of a core per process over {dt:.0f} s: min {cpu[0]:.2f} p50 {cpu[N // 2]:.2f} "
              f"max {cpu[-1]:.2f} mean {sum(cpu) / N:.2f}")
        print(f"sync KiB/s sent per process: min {kib[0]:.2f} p50 {kib[N // 2]:.2f} "
              f"max {kib[-1]:.2f} mean {sum(kib) / N:.2f}")
        # Kill one and time the others' detection.
        victim = N // 2
        seen = {}
        lock = threading.Lock()
        killed = time.time()
        procs[victim].send_signal(signal.SIGKILL)

        def watch(i):
            end = killed + (EXPIRY + 20 * HB) / 1000
            while time.time() < end:
                try:
                    s = state(i)
                    if any(p["node"] == nodes[victim] and p["state"] in ("EXPIRED",)
                           for p in s["peers"]):
                        with lock:
                            seen[i] = (time.time() - killed) * 1000
                        return
                except Exception:
                    pass
                time.sleep(0.05)

        ts = [threading.Thread(target=watch, args=(i,)) for i in range(N) if i != victim]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        d = sorted(seen.values())
        print(f"SIGKILL detected EXPIRED by {len(d)}/{N - 1}: min {d[0]:.0f} ms "
              f"p50 {d[len(d) // 2]:.0f} p99 {d[min(len(d) - 1, int(len(d) * 0.99))]:.0f} "
              f"max {d[-1]:.0f} ms (bounds: >= {EXPIRY - HB}, <= {EXPIRY} + {HB} per hop)")
        return 0 if len(d) == N - 1 else 1
    finally:
        for p in procs:
            try:
                p.kill()
                p.wait()
            except Exception:
                pass
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
