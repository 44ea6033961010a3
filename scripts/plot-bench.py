#!/usr/bin/env python3
"""Renders the benchmark matrix (one `anarchon bench --json` line per run)
as a PNG of claims/s and p99 against clients, one line per backend plus
etcd, and prints one markdown table per backend.

    plot-bench.py [MATRIX.jsonl] [OUT.png]

Repeated runs of the same (backend, clients) are reduced to their median.
scripts/bench-matrix.sh runs it in a venv with the pinned packages of
scripts/plot-bench.requirements.txt.
"""

import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    runs = defaultdict(list)
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                label = r.get("label") or r["backend"]
                if r.get("variant"):
                    label = f"{label} ({r['variant']})"
                runs[(label, r["clients"])].append(r)
    return runs


def med(rows, *path):
    vals = []
    for r in rows:
        v = r
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            vals.append(v)
    return statistics.median(vals) if vals else None


def cpu(rows, proc):
    """User + system CPU µs per claim of the sidecar ("process") or of etcd
    ("etcd_process"), median over rows."""
    vals = []
    for r in rows:
        p = (r.get("etcd") or {}).get("process") if proc == "etcd_process" else r.get(proc)
        c = (p or {}).get("server_cpu_us_per_claim")
        if isinstance(c, dict):
            vals.append(c.get("user", 0) + c.get("system", 0))
    return statistics.median(vals) if vals else None


def fmt(x, nd=0):
    if x is None:
        return "–"
    return f"{x:,.{nd}f}"


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks/matrix.jsonl"
    out = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks/claims.png"
    runs = load(src)
    backends = list(dict.fromkeys(b for b, _ in runs))
    etcd = defaultdict(list)  # clients -> runs that measured etcd
    for (_, c), rows in runs.items():
        etcd[c] += [r for r in rows if "etcd_claims_per_s" in r]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    for b in backends:
        cs = sorted(c for bb, c in runs if bb == b)
        ax1.plot(cs, [med(runs[(b, c)], "sidecar_claims_per_s") for c in cs], "o-", label=b)
        ax2.plot(cs, [med(runs[(b, c)], "p99_ms") for c in cs], "o-", label=b)
    ecs = sorted(c for c in etcd if etcd[c])
    if ecs:
        ax1.plot(ecs, [med(etcd[c], "etcd_claims_per_s") for c in ecs], "ks--", lw=2, label="etcd 3.4")
        ax2.plot(ecs, [med(etcd[c], "etcd_p99_ms") for c in ecs], "ks--", lw=2, label="etcd 3.4")
    for ax, title, unit in (
        (ax1, "claims/s through the sidecar (etcd: its own Txn)", "claims/s"),
        (ax2, "p99 claim latency", "ms"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([1, 16, 64] if not runs else sorted({c for _, c in runs}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    loads = [r.get("loadavg_start") for rows in runs.values() for r in rows]
    loads = [x for x in loads if isinstance(x, (int, float))]
    note = f"2 shared cores, load average {min(loads):.1f}–{max(loads):.1f}" if loads else ""
    fig.suptitle(f"anarchon bench, every claim a new slot (a write); {note}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}\n")

    for b in backends:
        cs = sorted(c for bb, c in runs if bb == b)
        print(f"#### {b}\n")
        print(
            "| clients | sidecar claims/s | raw claims/s | sidecar ÷ raw | raw 1/commit claims/s | sidecar ÷ raw 1/commit "
            "| etcd claims/s | sidecar ÷ etcd "
            "| sidecar p50 / p99 ms | raw p99 ms | etcd p99 ms | p99 overhead ms | RSS idle / load MiB | ready ms "
            "| sidecar CPU µs/claim | etcd CPU µs/claim | Redis Lua µs/call | load avg |"
        )
        print("|" + "---|" * 18)
        for c in cs:
            rows = runs[(b, c)]
            sc = med(rows, "sidecar_claims_per_s")
            e = med(rows, "etcd_claims_per_s") or med(etcd.get(c, []), "etcd_claims_per_s")
            ep99 = med(rows, "etcd_p99_ms") or med(etcd.get(c, []), "etcd_p99_ms")
            vs = f"{sc / e:.2f}" if sc and e else "–"
            print(
                f"| {c} | {fmt(sc)} | {fmt(med(rows, 'raw_claims_per_s'))} | {fmt(med(rows, 'ratio'), 2)} "
                f"| {fmt(med(rows, 'raw_single_claims_per_s'))} | {fmt(med(rows, 'ratio_vs_single'), 2)} "
                f"| {fmt(e)} | {vs} | {fmt(med(rows, 'p50_ms'), 2)} / {fmt(med(rows, 'p99_ms'), 2)} "
                f"| {fmt(med(rows, 'raw', 'p99_ms'), 2)} | {fmt(ep99, 2)} | {fmt(med(rows, 'overhead_p99_ms'), 2)} "
                f"| {fmt(med(rows, 'rss_idle_mib'), 1)} / {fmt(med(rows, 'rss_load_mib'), 1)} "
                f"| {fmt(med(rows, 'ready_ms'))} | {fmt(cpu(rows, 'process'))} | {fmt(cpu(rows, 'etcd_process'))} "
                f"| {fmt(med(rows, 'redis_lua_us_per_call'), 1)} | {fmt(med(rows, 'loadavg_start'), 1)} |"
            )
        print()
    if ecs:
        print("#### etcd 3.4.23 (started by the bench, fresh data dir)\n")
        print("| clients | claims/s | p50 / p99 ms | RSS idle / load MiB | ready ms |")
        print("|---|---|---|---|---|")
        for c in ecs:
            rows = etcd[c]
            print(
                f"| {c} | {fmt(med(rows, 'etcd_claims_per_s'))} "
                f"| {fmt(med(rows, 'etcd_p50_ms'), 2)} / {fmt(med(rows, 'etcd_p99_ms'), 2)} "
                f"| {fmt(med(rows, 'etcd', 'process', 'rss_idle_mib'), 1)} / {fmt(med(rows, 'etcd', 'process', 'rss_load_mib'), 1)} "
                f"| {fmt(med(rows, 'etcd', 'process', 'ready_ms'))} |"
            )
        print()


if __name__ == "__main__":
    main()
