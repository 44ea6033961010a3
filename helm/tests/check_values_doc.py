#!/usr/bin/env python3
"""Every key of values.yaml has a comment right above it, at its indentation.

    check_values_doc.py values.yaml

Prints `ok …` or `FAIL …: keys` and exits 1 when a key is undocumented.
"""
import re
import sys

KEY = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_.-]*):(\s|$)")

path = sys.argv[1]
lines = open(path).read().splitlines()
undocumented = []
for i, line in enumerate(lines):
    m = KEY.match(line)
    if not m:
        continue
    indent = m.group(1)
    prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    if not (prev.startswith(indent + "#")):
        undocumented.append(f"{i + 1}:{m.group(2)}")
if undocumented:
    print(f"FAIL every key of {path} is documented: {', '.join(undocumented)}")
    sys.exit(1)
print(f"ok every key of {path} is documented")
