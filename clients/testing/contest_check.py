"""Checks the clients' contest: exactly one WON per slot across every claimer.

    python contest_check.py SLOTS BASE FILE...

Each FILE holds lines "<lang> <sidecar> <slot> <OUTCOME> <attempt>". Prints the
counts and exits non-zero on a double win, a slot without a winner, an error,
or a claimer that did not answer for every slot.
"""

import collections
import sys


def main() -> int:
    n, base, files = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    wins = collections.defaultdict(list)
    per_claimer = collections.Counter()
    outcomes = collections.Counter()
    errors = []
    for f in files:
        for line in open(f):
            parts = line.split()
            if len(parts) < 4:
                continue
            lang, sidecar, slot, outcome = parts[0], parts[1], int(parts[2]), parts[3]
            per_claimer[(lang, sidecar)] += 1
            outcomes[outcome] += 1
            if outcome == "ERROR":
                errors.append(line.strip())
            elif outcome == "WON":
                wins[slot].append(f"{lang}/{sidecar}")
    double = {s: w for s, w in wins.items() if len(w) > 1}
    missing = [base + i for i in range(n) if base + i not in wins]
    short = {k: v for k, v in per_claimer.items() if v != n}
    langs = sorted({lang for lang, _ in per_claimer})
    by_lang = collections.Counter(w.split("/")[0] for ws in wins.values() for w in ws)
    print(f"contest: {n} slots, claimers {sorted(per_claimer)}, outcomes {dict(outcomes)}")
    print(f"contest: wins by language {dict(by_lang)}")
    print(f"contest: double wins {len(double)}, missing winners {len(missing)}, errors {len(errors)}")
    for s, w in list(double.items())[:10]:
        print(f"  double win at slot {s}: {w}")
    for s in missing[:10]:
        print(f"  no winner at slot {s}")
    for e in errors[:10]:
        print(f"  {e}")
    for k, v in short.items():
        print(f"  claimer {k} answered {v} of {n} slots")
    ok = not double and not missing and not errors and not short and len(per_claimer) == 2 * len(files)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
