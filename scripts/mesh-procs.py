#!/usr/bin/env python3
"""Real-process mesh run (issue 20): N `anarchon serve` processes on this
machine, each on its own loopback address (process i: gRPC
127.0.2.(i+1):50051, admin 127.0.2.(i+1):9464; the mesh binds its dials to
the listen address), each told only the first one's address, one shared
SQLite store.

Waits until every process lists every other ALIVE, checks once with `ss`
that every mesh connection was dialled from the dialler's own address, lets
the mesh settle, then measures for WINDOW seconds per process: CPU (utime +
stime from /proc/PID/stat), sync bytes sent (`sent_bytes` of
/api/v1/mesh/state) and links. Then SIGKILLs one process (index N/2) and
records when each other one first lists it EXPIRED (polled every 50 ms),
against the bounds expiry − 1 heartbeat and expiry + one heartbeat per relay
hop.

With --partition (root and nftables needed), after the kill phase: once the
N − 1 live processes list each other ALIVE again, an nftables table
`inet meshprocs` drops every packet between the first half of the addresses
(127.0.2.1 … 127.0.2.(N/2)) and the second (both directions, output hook;
the killed process is in the second half and stays dead). Every live
process is polled (every 100 ms, client-side times; the poller binds to
127.0.0.1, which no rule matches) for: when it first lists every live
process of the other half not ALIVE, then EXPIRED; per pair, when it first
lists that one EXPIRED; whether it lists every live process of its own half
ALIVE throughout (violations counted, from the cut to the end of the heal).
The cut is held until every process lists the whole other half EXPIRED and
then one more expiry; then the rules are removed (the heal) and the time is
measured until every live process lists all the others ALIVE. Exits
non-zero if the other half is not EXPIRED everywhere within expiry + 20
heartbeats, if the mesh has not healed within 60 s, or if a half broke
apart; the table is deleted in any case. It also prints each process's
links to its own and to the other half just before the cut and the heal,
and, for the own-half pairs listed not ALIVE, the worst state listed, when
it began and how long it lasted.

    scripts/mesh-procs.py BIN N [HEARTBEAT_MS EXPIRY_MS MAX_LINKS WINDOW_S] [--partition]
"""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

PARTITION = "--partition" in sys.argv[1:]
ARGS = [a for a in sys.argv[1:] if a != "--partition"]
BIN = ARGS[0]
N = int(ARGS[1])
HB = int(ARGS[2]) if len(ARGS) > 2 else 500
EXPIRY = int(ARGS[3]) if len(ARGS) > 3 else 5000
MAX_LINKS = int(ARGS[4]) if len(ARGS) > 4 else 8
WINDOW = float(ARGS[5]) if len(ARGS) > 5 else 30.0
GRPC_PORT = 50051
ADMIN_PORT = 9464
HEAL_BOUND = 60.0
TABLE = "meshprocs"
TICK = os.sysconf("SC_CLK_TCK")


def ip(i):
    return f"127.0.2.{i + 1}"


def state(i):
    c = http.client.HTTPConnection(ip(i), ADMIN_PORT, timeout=5,
                                   source_address=("127.0.0.1", 0))
    try:
        c.request("GET", "/api/v1/mesh/state")
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
        return json.loads(r.read())
    finally:
        c.close()


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def nft(*args, check=True):
    r = subprocess.run(["nft", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {r.stderr.strip()}")
    return r


def pct(d, q):
    return d[min(len(d) - 1, int(len(d) * q))]


def fig(d, unit="ms"):
    if not d:
        return "none"
    return (f"min {d[0]:.0f} p50 {d[len(d) // 2]:.0f} p99 {pct(d, 0.99):.0f} "
            f"max {d[-1]:.0f} {unit}")


def check_sources(procs):
    """Every established mesh connection (to port GRPC_PORT) of our
    processes: does the dialling end use its own process's address?"""
    out = subprocess.run(["ss", "-tnpH", "state", "established"],
                         capture_output=True, text=True).stdout
    ip_of = {p.pid: ip(i) for i, p in enumerate(procs)}
    good = bad = 0
    examples = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 5:
            continue
        local, peer = f[2], f[3]
        if not peer.endswith(f":{GRPC_PORT}") or local.endswith(f":{GRPC_PORT}"):
            continue
        m = re.search(r"pid=(\d+)", line)
        if not m or int(m.group(1)) not in ip_of:
            continue
        own = ip_of[int(m.group(1))]
        if local.rsplit(":", 1)[0] == own:
            good += 1
        else:
            bad += 1
            if len(examples) < 3:
                examples.append(f"{own} dialled {peer} from {local}")
    return good, bad, examples


def wait_formed(live, nodes, bound):
    """Until every live process lists every other live one ALIVE."""
    start = time.time()
    while True:
        time.sleep(0.2)
        try:
            sts = {i: state(i) for i in live}
        except Exception:
            continue
        ok = True
        for i in live:
            alive = {p["node"] for p in sts[i]["peers"] if p["state"] == "ALIVE"}
            if any(nodes[j] not in alive for j in live if j != i):
                ok = False
                break
        if ok:
            return time.time() - start
        if time.time() - start > bound:
            return None


def link_split(live, side):
    """Per live process: (links to its own half, links to the other half)."""
    own, cross, per = [], [], {}
    for i in live:
        try:
            ls = state(i)["links"]
        except Exception:
            continue
        halves = []
        for l in ls:
            a = (l.get("address") or "").rsplit(":", 1)[0]
            if a.startswith("127.0.2."):
                halves.append(side.get(int(a.rsplit(".", 1)[1]) - 1))
        own.append(sum(1 for h in halves if h == side[i]))
        cross.append(sum(1 for h in halves if h is not None and h != side[i]))
        per[i] = (own[-1], cross[-1])
    return sorted(own), sorted(cross), per


def spread(d):
    return f"min {d[0]} p50 {d[len(d) // 2]} max {d[-1]} (mean {sum(d) / len(d):.1f})"


def partition(procs, nodes, victim):
    live = [i for i in range(N) if i != victim]
    half = N // 2
    side = {i: (0 if i < half else 1) for i in range(N)}
    a_lo, a_hi, b_lo, b_hi = ip(0), ip(half - 1), ip(half), ip(N - 1)
    settled = wait_formed(live, nodes, 60)
    if settled is None:
        print("partition: the live processes did not all list each other ALIVE "
              "within 60 s of the kill phase")
        return 1
    print(f"\npartition: the {len(live)} live processes list each other ALIVE "
          f"{settled:.1f} s after the kill phase")
    time.sleep(10 * HB / 1000)
    index = {n: k for k, n in enumerate(nodes)}
    # samples[i]: list of (t, states) where states[j] is one letter per
    # process: A(LIVE) U(NREACHABLE) E(XPIRED) L(EFT) - (absent).
    samples = {i: [] for i in live}
    errors = {i: 0 for i in live}
    stop = threading.Event()

    def poll(i):
        while not stop.is_set():
            t = time.time()
            try:
                s = state(i)
            except Exception:
                errors[i] += 1
                time.sleep(0.1)
                continue
            row = ["-"] * N
            for p in s["peers"]:
                k = index.get(p["node"])
                if k is not None:
                    row[k] = p["state"][0]
            samples[i].append((time.time(), "".join(row)))
            time.sleep(max(0.0, 0.1 - (time.time() - t)))

    ts = [threading.Thread(target=poll, args=(i,), daemon=True) for i in live]
    nft("delete", "table", "inet", TABLE, check=False)
    rc = 0
    try:
        nft("add", "table", "inet", TABLE)
        nft("add", "chain", "inet", TABLE, "out",
            "{ type filter hook output priority 0; policy accept; }")
        for t in ts:
            t.start()
        time.sleep(1)
        before = link_split(live, side)
        cut = time.time()
        nft("add", "rule", "inet", TABLE, "out", "ip", "saddr", f"{a_lo}-{a_hi}",
            "ip", "daddr", f"{b_lo}-{b_hi}", "drop")
        nft("add", "rule", "inet", TABLE, "out", "ip", "saddr", f"{b_lo}-{b_hi}",
            "ip", "daddr", f"{a_lo}-{a_hi}", "drop")
        print(f"cut: {a_lo}-{a_hi} ({half} processes) | {b_lo}-{b_hi} "
              f"({N - half} processes, one of them the killed {ip(victim)}); "
              f"dropped both ways (nft table inet {TABLE})")
        others = {i: [j for j in live if side[j] != side[i]] for i in live}
        own = {i: [j for j in live if side[j] == side[i] and j != i] for i in live}

        def all_expired(i):
            if not samples[i]:
                return False
            t, row = samples[i][-1]
            return t > cut and all(row[j] in "E-" for j in others[i])

        deadline = cut + (EXPIRY + 20 * HB) / 1000
        while not all(all_expired(i) for i in live):
            if time.time() > deadline:
                missing = sum(1 for i in live if not all_expired(i))
                print(f"FAIL: {missing} processes still do not list the whole other half "
                      f"EXPIRED {EXPIRY + 20 * HB} ms after the cut")
                rc = 1
                break
            time.sleep(0.1)
        all_exp = time.time() - cut
        time.sleep(EXPIRY / 1000 - 0.7)
        during = link_split(live, side)
        heal = time.time()
        nft("flush", "chain", "inet", TABLE, "out")
        print(f"heal: rules removed {heal - cut:.1f} s after the cut "
              f"(every process listed the other half EXPIRED {all_exp:.1f} s after it, "
              f"then one expiry more)")

        def whole(i):
            if not samples[i]:
                return False
            t, row = samples[i][-1]
            return t > heal and all(row[j] == "A" for j in live if j != i)

        healed_at = None
        while time.time() - heal < HEAL_BOUND:
            if all(whole(i) for i in live):
                healed_at = time.time()
                break
            time.sleep(0.1)
        time.sleep(0.3)
        stop.set()
        for t in ts:
            t.join()
        # Analysis on the client-side sample times.
        not_alive, expired, pair_exp = [], [], []
        viol_samples = 0
        viol_pairs = set()
        viol_procs = set()
        first_viol = None
        heal_t = []
        gaps = []
        for i in live:
            rows = [(t, r) for t, r in samples[i] if t > cut]
            prev = None
            for t, _ in samples[i]:
                if prev is not None:
                    gaps.append((t - prev) * 1000)
                prev = t
            na = next((t for t, r in rows if all(r[j] != "A" for j in others[i])), None)
            ex = next((t for t, r in rows if all(r[j] in "E-" for j in others[i])), None)
            if na is not None:
                not_alive.append((na - cut) * 1000)
            if ex is not None:
                expired.append((ex - cut) * 1000)
            for j in others[i]:
                pe = next((t for t, r in rows if t < heal and r[j] == "E"), None)
                if pe is not None:
                    pair_exp.append((pe - cut) * 1000)
            for t, r in rows:
                if healed_at is not None and t > healed_at:
                    break
                bad = [j for j in own[i] if r[j] != "A"]
                if bad:
                    viol_samples += 1
                    viol_procs.add(i)
                    for j in bad:
                        viol_pairs.add((i, j))
                    if first_viol is None or t < first_viol[0]:
                        first_viol = (t, i, bad[0], r[bad[0]])
            h = next((t for t, r in rows if t > heal
                      and all(r[j] == "A" for j in live if j != i)), None)
            if h is not None:
                heal_t.append((h - heal) * 1000)
        not_alive.sort(); expired.sort(); pair_exp.sort(); heal_t.sort(); gaps.sort()
        n_pairs = sum(len(others[i]) for i in live)
        print(f"poll gap per process (client side): p50 {gaps[len(gaps) // 2]:.0f} "
              f"p99 {pct(gaps, 0.99):.0f} max {gaps[-1]:.0f} ms; failed polls "
              f"{sum(errors.values())}")
        print(f"cut -> a process lists the whole other half not ALIVE, "
              f"{len(not_alive)}/{len(live)}: {fig(not_alive)} (ALIVE lasts expiry/2 = {EXPIRY // 2} ms)")
        print(f"cut -> a process lists the whole other half EXPIRED, "
              f"{len(expired)}/{len(live)}: {fig(expired)}")
        print(f"cut -> EXPIRED per pair, {len(pair_exp)}/{n_pairs}: {fig(pair_exp)} "
              f"(bounds: >= {EXPIRY - HB}, <= {EXPIRY} + {HB} per hop)")
        early = sum(1 for d in pair_exp if d < EXPIRY - HB)
        print(f"  pairs EXPIRED before expiry - 1 heartbeat: {early}; after expiry + 1 hop "
              f"({EXPIRY + HB}): {sum(1 for d in pair_exp if d > EXPIRY + HB)}, "
              f"+2 hops ({EXPIRY + 2 * HB}): {sum(1 for d in pair_exp if d > EXPIRY + 2 * HB)}, "
              f"+3 hops ({EXPIRY + 3 * HB}): {sum(1 for d in pair_exp if d > EXPIRY + 3 * HB)}")
        print(f"links per process just before the cut: to its own half {spread(before[0])}, "
              f"to the other half {spread(before[1])}")
        print(f"links per process just before the heal: to its own half {spread(during[0])}, "
              f"to the other half {spread(during[1])}")
        print(f"halves whole (each process lists its own half ALIVE, cut to healed): "
              f"{viol_samples} violating samples, {len(viol_procs)} processes, "
              f"{len(viol_pairs)} pairs (of {sum(len(own[i]) for i in live)})")
        if viol_pairs:
            # Per violating pair: worst state, longest run of samples not ALIVE
            # (first bad sample to first ALIVE sample after it), when it began.
            worst = {"U": 0, "E": 0, "L": 0, "-": 0}
            expired_pairs = []
            runs, starts, after_heal = [], [], 0
            for i in live:
                rows = [(t, r) for t, r in samples[i] if t > cut
                        and (healed_at is None or t <= healed_at)]
                for j in own[i]:
                    if (i, j) not in viol_pairs:
                        continue
                    sts = {r[j] for _, r in rows if r[j] != "A"}
                    worst["E" if "E" in sts else "-" if "-" in sts
                          else "L" if "L" in sts else "U"] += 1
                    if "E" in sts:
                        t = next(t for t, r in rows if r[j] == "E")
                        expired_pairs.append((t, i, j))
                    b = None
                    for t, r in rows:
                        if r[j] != "A" and b is None:
                            b = t
                            starts.append((t - cut) * 1000)
                            if t > heal:
                                after_heal += 1
                        elif r[j] == "A" and b is not None:
                            runs.append((t - b) * 1000)
                            b = None
                    if b is not None:
                        runs.append((rows[-1][0] - b) * 1000)
            runs.sort(); starts.sort()
            print(f"  violating pairs by worst state listed: UNREACHABLE {worst['U']}, "
                  f"EXPIRED {worst['E']}, LEFT {worst['L']}, absent {worst['-']}")
            bp = before[2]
            for t, i, j in sorted(expired_pairs)[:12]:
                print(f"  {ip(i)} listed {ip(j)} (own half) EXPIRED {(t - cut) * 1000:.0f} ms "
                      f"after the cut; links (own half, other half) just before the cut: "
                      f"{ip(i)} {bp.get(i)}, {ip(j)} {bp.get(j)}")
            print(f"  a violation began (ms after the cut): {fig(starts)}; "
                  f"{after_heal} began after the heal")
            print(f"  a violation lasted (first sample not ALIVE to the next ALIVE one): "
                  f"{fig(runs)}")
        if first_viol:
            t, i, j, st = first_viol
            print(f"  first violation: {ip(i)} listed {ip(j)} {st} "
                  f"{(t - cut) * 1000:.0f} ms after the cut")
        if healed_at is not None:
            print(f"heal -> every live process lists all {len(live) - 1} others ALIVE: "
                  f"{(healed_at - heal) * 1000:.0f} ms (seen by the main loop); "
                  f"per process {fig(heal_t)}")
        else:
            worst = sorted(sum(1 for j in live if j != i and samples[i][-1][1][j] != "A")
                           for i in live if samples[i])
            print(f"FAIL: the mesh did not heal within {HEAL_BOUND:.0f} s: others not ALIVE "
                  f"per process min {worst[0]} p50 {worst[len(worst) // 2]} max {worst[-1]}")
            rc = 1
        if viol_samples:
            print("FAIL: a half broke apart (a process listed one of its own half not ALIVE)")
            rc = 1
        if len(expired) < len(live):
            rc = 1
        return rc
    finally:
        stop.set()
        nft("delete", "table", "inet", TABLE, check=False)


def main():
    root = tempfile.mkdtemp(prefix="mesh-procs-")
    db = f"sqlite://{root}/shared.db"
    procs = []
    try:
        for i in range(N):
            args = [
                BIN, "serve",
                "--listen", f"{ip(i)}:{GRPC_PORT}",
                "--admin-listen", f"{ip(i)}:{ADMIN_PORT}",
                "--data-dir", f"{root}/n{i}",
                "--backend", db,
                "--heartbeat-ms", str(HB), "--expiry-ms", str(EXPIRY),
                "--max-links", str(MAX_LINKS),
            ]
            if i > 0:
                args += ["--peer", f"{ip(0)}:{GRPC_PORT}"]
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
        good, bad, ex = check_sources(procs)
        print(f"mesh connections dialled from the dialler's own address: {good} of "
              f"{good + bad}" + (f" (not: {'; '.join(ex)})" if bad else ""))
        if PARTITION and (bad or not good):
            print("FAIL: dials do not come from each process's own address; a cut by "
                  "address would not hold")
            return 1
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
        print(f"SIGKILL of {ip(victim)} detected EXPIRED by {len(d)}/{N - 1}: min {d[0]:.0f} ms "
              f"p50 {d[len(d) // 2]:.0f} p99 {d[min(len(d) - 1, int(len(d) * 0.99))]:.0f} "
              f"max {d[-1]:.0f} ms (bounds: >= {EXPIRY - HB}, <= {EXPIRY} + {HB} per hop)")
        rc = 0 if len(d) == N - 1 else 1
        if PARTITION:
            rc = partition(procs, nodes, victim) or rc
        return rc
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
