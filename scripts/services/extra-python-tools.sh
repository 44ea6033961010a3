#!/usr/bin/env bash
# The Python tools tests/tools.rs checks the sidecar with: other people's
# parsers and clients (prometheus_client's text and OpenMetrics parsers,
# grpcio-reflection's v1alpha descriptor database). Installed from PyPI when
# missing. Run by scripts/test.sh (it runs every extra-*.sh).
set -euo pipefail
if python3 -c 'import prometheus_client, grpc, grpc_reflection' 2>/dev/null; then
  exit 0
fi
python3 -m pip install --quiet prometheus_client grpcio grpcio-reflection
