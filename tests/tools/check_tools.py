"""Checks a running sidecar with tools written by other people (issue 21, 9).

Usage: check_tools.py GRPC_ADDR ADMIN_ADDR

* /metrics, default content type: prometheus_client's Prometheus text
  parser must see every counter as one family, with its help text.
* /metrics with Accept: application/openmetrics-text: prometheus_client's
  OpenMetrics parser must accept it.
* Reflection v1alpha: grpcio-reflection's ProtoReflectionDescriptorDatabase
  must list anarchon.v1.Claims, anarchon.v1.Mesh and grpc.health.v1.Health.
* A body that is not protobuf sent to Claim: INVALID_ARGUMENT.
Exits non-zero with a message on the first failure.
"""
import sys
import urllib.request

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_families,
)
from prometheus_client.parser import text_string_to_metric_families


def fail(msg):
    print("check_tools: " + msg, file=sys.stderr)
    sys.exit(1)


def get(url, accept=None):
    req = urllib.request.Request(url)
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers.get("Content-Type", ""), r.read().decode()


def main():
    grpc_addr, admin = sys.argv[1], sys.argv[2]

    ctype, text = get(f"http://{admin}/metrics")
    if not ctype.startswith("text/plain"):
        fail(f"default content type is {ctype!r}, not text/plain")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    claims = fams.get("anarchon_claims")
    if claims is None or claims.type != "counter":
        fail(f"anarchon_claims is not one counter family: {sorted(fams)}")
    if not claims.documentation:
        fail("anarchon_claims has no help text")
    if any(n.endswith("_total") for n in fams):
        fail(f"a counter was split into an untyped _total family: {sorted(fams)}")
    won = [s for s in claims.samples if s.labels.get("outcome") == "WON"]
    if not won or won[0].value < 1:
        fail(f"no WON claim counted: {claims.samples}")

    ctype, om = get(
        f"http://{admin}/metrics",
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    )
    if not ctype.startswith("application/openmetrics-text"):
        fail(f"OpenMetrics was asked for, got {ctype!r}")
    om_names = {f.name for f in om_families(om)}
    if "anarchon_claims" not in om_names:
        fail(f"OpenMetrics parse lacks anarchon_claims: {sorted(om_names)}")

    channel = grpc.insecure_channel(grpc_addr)
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    for want in ("anarchon.v1.Claims", "anarchon.v1.Mesh", "grpc.health.v1.Health"):
        if want not in services:
            fail(f"reflection v1alpha does not list {want}: {sorted(services)}")
    db.FindFileContainingSymbol("anarchon.v1.Claims")

    raw = channel.unary_unary("/anarchon.v1.Claims/Claim")
    try:
        raw(b"\xff\xff\xff", timeout=10)
        fail("a malformed body was accepted")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
            fail(f"a malformed body answered {e.code()}: {e.details()}")
    print("check_tools: ok")


main()
