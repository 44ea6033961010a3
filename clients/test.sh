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
#   C     its own SQLite file, requires a bearer token; also listens on a
#         Unix socket ($ANARCHON_C_UNIX, unix:PATH)
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
want python || want go || want java || want contest || summary
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
export ANARCHON_C_UNIX="unix:$work/c.sock"
printf '%s\n' "$ANARCHON_C_TOKEN" >"$work/c.token"
mkdir -p "$work/a" "$work/b" "$work/c"
# A long expiry: every valid_for_ms is capped at the self-fence (expiry − a
# tenth, counted from the last liveness refresh; docs/safety.md), and the
# tests compare valid_for with leases of up to 5 s.
mesh=(--heartbeat-ms 200 --expiry-ms 20000)
"$bin" serve --listen "$ANARCHON_A" --admin-listen 127.0.0.1:0 --data-dir "$work/a" \
  --backend "sqlite://$work/shared.db" --peer "$ANARCHON_B" "${mesh[@]}" >"$work/a.log" 2>&1 &
pid_a=$!; pids+=("$pid_a")
"$bin" serve --listen "$ANARCHON_B" --admin-listen 127.0.0.1:0 --data-dir "$work/b" \
  --backend "sqlite://$work/shared.db" --peer "$ANARCHON_A" "${mesh[@]}" >"$work/b.log" 2>&1 &
pids+=("$!")
"$bin" serve --listen "$ANARCHON_C" --admin-listen 127.0.0.1:0 --data-dir "$work/c" \
  --auth-token-file "$work/c.token" --listen-unix "$work/c.sock" >"$work/c.log" 2>&1 &
pids+=("$!")
export ANARCHON_A_PID="$pid_a"
if ! "$py" "$here/testing/wait_ready.py" "$ANARCHON_A" "$ANARCHON_B" "$ANARCHON_C" >"$work/ready.log" 2>&1; then
  cat "$work/ready.log"; tail -n 20 "$work"/{a,b,c}.log
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
  unformatted="$(cd "$here/go" && gofmt -l $(find . -name '*.go' -not -path './anarchonv1/*'))"
  if [ -n "$unformatted" ]; then note "  gofmt: not formatted: $unformatted"; rc=1; fi
  grep -E '^(--- |ok|FAIL)|^\s+\S+_test\.go:[0-9]+' "$work/go.log"
  p=$(grep -cE '^--- PASS' "$work/go.log")
  f=$(grep -cE '^--- FAIL' "$work/go.log")
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then tail -30 "$work/go.log"; f=1; fi
  record go "$p" "$f"
fi

# ----------------------------------------------------------------------- java
# javac against Debian's jars (Maven Central is not reachable; pom.xml is for users).
# netty-all.jar is empty on Debian: the individual netty jars are listed.
jars=(grpc-api grpc-core grpc-context grpc-netty grpc-protobuf grpc-protobuf-lite grpc-stub
  protobuf guava perfmark-api gson jsr305 error_prone_annotations geronimo-annotation-1.3-spec
  netty-buffer netty-codec netty-codec-http netty-codec-http2 netty-codec-socks netty-common
  netty-handler netty-handler-proxy netty-resolver netty-transport netty-transport-native-unix-common
  junit4 hamcrest-core)
jcp=""
for j in "${jars[@]}"; do jcp="$jcp${jcp:+:}/usr/share/java/$j.jar"; done
jbuild() {
  mkdir -p "$work/java/classes" "$work/java/test-classes" &&
    javac -nowarn -encoding UTF-8 -d "$work/java/classes" -cp "$jcp" \
      $(find "$here/java/src/main/java" -name '*.java') &&
    javac -nowarn -encoding UTF-8 -d "$work/java/test-classes" -cp "$work/java/classes:$jcp" \
      $(find "$here/java/src/test/java" -name '*.java')
}
jrun() { java -cp "$work/java/test-classes:$work/java/classes:$jcp" "$@"; }
java_built=0
if want java || want contest; then
  note "== java: javac"
  if jbuild >"$work/javac.log" 2>&1; then java_built=1; else cat "$work/javac.log"; fi
fi
if want java; then
  note "== java (JUnit 4)"
  if [ "$java_built" = 1 ]; then
    jrun org.junit.runner.JUnitCore io.anarchon.client.AnarchonClientTest >"$work/java.log" 2>&1
    rc=$?
    grep -vE '^\s+at ' "$work/java.log" | tail -40
    if line=$(grep -oE '^OK \([0-9]+ tests?\)' "$work/java.log"); then
      p=$(grep -oE '[0-9]+' <<<"$line"); f=0
    elif line=$(grep -E '^Tests run: [0-9]+, +Failures: [0-9]+' "$work/java.log"); then
      n=$(sed -E 's/^Tests run: ([0-9]+).*/\1/' <<<"$line"); f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$line")
      p=$((n - f))
    else
      p=0; f=1
    fi
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
    record java "$p" "$f"
  else
    record java 0 1
  fi
fi

# -------------------------------------------------------------------- contest
# Python, Go and Java claimers race for the same slots through A and B (one
# shared SQLite file): exactly one WON per slot, no double wins, no slot left
# without a winner.
if want contest; then
  note "== contest: python, go and java claimers on two sidecars"
  export CONTEST_JOB="contest-$RANDOM$RANDOM" CONTEST_SLOTS="${CONTEST_SLOTS:-100}"
  ok=1
  (cd "$gopkg" && "${goenv[@]}" go build -o "$work/contest-go" ./internal/contest) >"$work/contest-build.log" 2>&1 || ok=0
  [ "$java_built" = 1 ] || ok=0
  if [ "$ok" = 1 ]; then
    now_ms=$("$py" -c 'import time; print(int(time.time() * 1000))')
    export CONTEST_BASE="$now_ms" CONTEST_START_MS=$((now_ms + 4000))
    "$py" "$here/python/tests/contest.py" >"$work/contest-python.out" 2>"$work/contest-python.err" & cp1=$!
    "$work/contest-go" >"$work/contest-go.out" 2>"$work/contest-go.err" & cp2=$!
    jrun io.anarchon.client.Contest >"$work/contest-java.out" 2>"$work/contest-java.err" & cp3=$!
    wait "$cp1" || ok=0; wait "$cp2" || ok=0; wait "$cp3" || ok=0
    cat "$work"/contest-*.err
    "$py" "$here/testing/contest_check.py" "$CONTEST_SLOTS" "$CONTEST_BASE" \
      "$work/contest-python.out" "$work/contest-go.out" "$work/contest-java.out" || ok=0
  else
    cat "$work/contest-build.log"; note "  contest: a claimer could not be built"
  fi
  if [ "$ok" = 1 ]; then record contest 1 0; else record contest 0 1; fi
fi

summary
