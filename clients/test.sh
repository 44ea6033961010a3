#!/usr/bin/env bash
# Tests the Go, Python and Java clients against real `anarchon serve` sidecars.
#
#   clients/test.sh                  # everything
#   clients/test.sh python go        # only some suites (generated-code check,
#                                    # python, go, java, contest)
#
# It installs what is missing (Debian packages with apt-get, Python packages in
# a venv under $ANARCHON_CLIENTS_CACHE, default ~/.cache/anarchon-clients),
# regenerates the stubs and fails if they differ from the committed ones,
# starts three sidecars on free loopback ports:
#   A, B  one shared SQLite file, linked as peers (the two-sidecar contest and
#         the lost-lease tests, which pause A with SIGSTOP)
#   C     its own SQLite file, requires a bearer token
# runs each client's tests, then a contest in which Python, Go and Java
# claimers race for the same slots through A and B, and stops the sidecars.
# The sidecar binary is $ANARCHON_BIN, else `cargo build --bin anarchon`.
# The last line is "clients: N passed, M failed"; the exit status is non-zero
# on any failure.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"

suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(generated python go java contest)
want() { local s; for s in "${suites[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/anarchon-clients.XXXXXX")"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
results=()
note() { printf '%s\n' "$*"; }
# record SUITE PASSED FAILED
record() {
  passed=$((passed + $2)); failed=$((failed + $3))
  results+=("$(printf '%-10s %3d passed, %d failed' "$1" "$2" "$3")")
}
die_setup() {
  note "clients/test.sh: $*" >&2
  failed=$((failed + 1))
  summary
}
summary() {
  echo
  echo "== clients summary"
  local r; for r in "${results[@]}"; do echo "  $r"; done
  echo "clients: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

# ---------------------------------------------------------------- toolchains
need_debs=(protobuf-compiler)
if want go || want generated || want contest; then
  need_debs+=(golang-go golang-google-grpc-dev golang-google-protobuf-dev
    golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc)
fi
if want java || want generated || want contest; then
  need_debs+=(default-jdk-headless libgrpc-java libprotobuf-java protobuf-compiler-grpc-java-plugin
    libnetty-java libperfmark-java libgoogle-gson-java libguava-java junit4 libgeronimo-annotation-1.3-spec-java
    libjsr305-java liberror-prone-java)
fi
missing=()
for p in "${need_debs[@]}"; do
  if [ "$p" = default-jdk-headless ] && command -v javac >/dev/null 2>&1; then continue; fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  note "== installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq >"$work/apt.log" 2>&1 &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$work/apt.log" 2>&1 ||
    { cat "$work/apt.log" >&2; die_setup "apt-get install failed"; }
fi

cache="${ANARCHON_CLIENTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/anarchon-clients}"
venv="$cache/venv"
py="$venv/bin/python"
pins="$(cat "$here/python/generate-requirements.txt")"
if ! "$py" -c 'import grpc_tools, pytest' >/dev/null 2>&1 ||
  ! grep -qix "$pins" <<<"$("$py" -m pip freeze 2>/dev/null)"; then
  note "== preparing the Python venv $venv"
  mkdir -p "$cache"
  python3 -m venv "$venv" >"$work/venv.log" 2>&1 &&
    "$py" -m pip install -q --disable-pip-version-check -r "$here/python/generate-requirements.txt" pytest >>"$work/venv.log" 2>&1 ||
    { cat "$work/venv.log" >&2; die_setup "could not prepare the Python venv"; }
fi
# Install the client exactly as a user would (pip install ./clients/python),
# from a copy so that the checkout gets no build/ directory.
cp -r "$here/python" "$work/pysrc"
rm -rf "$work/pysrc/build" "$work/pysrc"/*.egg-info
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$work/pysrc" >"$work/pip.log" 2>&1 ||
  { cat "$work/pip.log" >&2; die_setup "pip install ./clients/python failed"; }

# ------------------------------------------------------------ generated code
if want generated; then
  note "== generated code is up to date"
  if PYTHON="$py" "$here/generate.sh" "$work/gen" >"$work/gen.log" 2>&1; then
    bad=0
    for d in python/anarchon/v1 go/anarchonv1 java/src/main/java/io/anarchon/v1; do
      if ! diff -r "$work/gen/$d" "$here/$d" >"$work/gen.diff" 2>&1; then
        note "  clients/$d differs from clients/generate.sh's output:"; head -40 "$work/gen.diff"; bad=1
      fi
    done
    if [ "$bad" = 0 ]; then record generated 1 0; else record generated 0 1; fi
  else
    cat "$work/gen.log"; record generated 0 1
  fi
fi

# ------------------------------------------------------------------ sidecars
if [ -n "${ANARCHON_BIN:-}" ]; then
  bin="$ANARCHON_BIN"
else
  note "== cargo build --bin anarchon"
  cargo build --quiet --bin anarchon || die_setup "cargo build failed"
  bin="${CARGO_TARGET_DIR:-$root/target}/debug/anarchon"
fi
[ -x "$bin" ] || die_setup "no anarchon binary at $bin"

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_a=$(free_port); port_b=$(free_port); port_c=$(free_port)
while [ "$port_b" = "$port_a" ]; do port_b=$(free_port); done
while [ "$port_c" = "$port_a" ] || [ "$port_c" = "$port_b" ]; do port_c=$(free_port); done
export ANARCHON_A="127.0.0.1:$port_a" ANARCHON_B="127.0.0.1:$port_b" ANARCHON_C="127.0.0.1:$port_c"
export ANARCHON_C_TOKEN="clients-test-$RANDOM$RANDOM"
printf '%s\n' "$ANARCHON_C_TOKEN" >"$work/c.token"
mkdir -p "$work/a" "$work/b" "$work/c"
mesh=(--heartbeat-ms 200 --expiry-ms 5000)
"$bin" serve --listen "$ANARCHON_A" --admin-listen 127.0.0.1:0 --data-dir "$work/a" \
  --backend "sqlite://$work/shared.db" --peer "$ANARCHON_B" "${mesh[@]}" >"$work/a.log" 2>&1 &
pid_a=$!; pids+=("$pid_a")
"$bin" serve --listen "$ANARCHON_B" --admin-listen 127.0.0.1:0 --data-dir "$work/b" \
  --backend "sqlite://$work/shared.db" --peer "$ANARCHON_A" "${mesh[@]}" >"$work/b.log" 2>&1 &
pids+=("$!")
"$bin" serve --listen "$ANARCHON_C" --admin-listen 127.0.0.1:0 --data-dir "$work/c" \
  --auth-token-file "$work/c.token" >"$work/c.log" 2>&1 &
pids+=("$!")
export ANARCHON_A_PID="$pid_a"
if ! "$py" "$here/testing/wait_ready.py" "$ANARCHON_A" "$ANARCHON_B" "$ANARCHON_C" >"$work/ready.log" 2>&1; then
  cat "$work/ready.log"; tail -20 "$work"/{a,b,c}.log
  die_setup "the sidecars did not come up"
fi
note "== sidecars up: A=$ANARCHON_A (pid $pid_a) B=$ANARCHON_B C=$ANARCHON_C (token)"

# --------------------------------------------------------------------- python
if want python; then
  note "== python (pytest)"
  (cd "$here/python/tests" && "$py" -m pytest -q -p no:cacheprovider .) 2>&1 | tee "$work/python.log"
  line="$(grep -E '[0-9]+ (passed|failed|error)' "$work/python.log" | tail -1)"
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+' || echo 0)
  f=$(grep -oE '[0-9]+ (failed|errors?)' <<<"$line" | awk '{s += $1} END {print s + 0}')
  [ -z "$p" ] && p=0; [ -z "$f" ] && f=0
  if [ "$p" = 0 ] && [ "$f" = 0 ]; then f=1; fi
  record python "$p" "$f"
fi

# ------------------------------------------------------------------------- go
# GOPATH mode with Debian's Go packages (there is no module proxy here).
gopath="$work/gopath"
mkdir -p "$gopath/src/github.com/anarchon/anarchon/clients"
ln -s "$here/go" "$gopath/src/github.com/anarchon/anarchon/clients/go"
gopkg="$gopath/src/github.com/anarchon/anarchon/clients/go"
goenv=(env GO111MODULE=off GOPATH="$gopath:/usr/share/gocode")
if want go; then
  note "== go (go vet, go test)"
  (cd "$gopkg" && "${goenv[@]}" go vet ./... && "${goenv[@]}" go test -count=1 -v ./...) >"$work/go.log" 2>&1
  rc=$?
  grep -E '^(--- |ok|FAIL)|^\s+\S+_test\.go:[0-9]+' "$work/go.log"
  p=$(grep -cE '^--- PASS' "$work/go.log")
  f=$(grep -cE '^--- FAIL' "$work/go.log")
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then tail -30 "$work/go.log"; f=1; fi
  record go "$p" "$f"
fi

summary
