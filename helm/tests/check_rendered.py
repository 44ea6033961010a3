#!/usr/bin/env python3
"""Assertions on the objects `helm template` rendered, derived from the values.

    check_rendered.py [--subchart KEY] RENDERED.yaml CHART_DIR [VALUES.yaml ...]

The values are the chart's values.yaml merged with each VALUES file, as Helm
merges them, so every assertion follows from what the user asked for. With
--subchart KEY the VALUES files belong to a parent chart that depends on this
one, and their KEY section is this chart's values; the Deployment checked is
then the parent's, the one that includes the sidecar. Prints
one `ok NAME` or `FAIL NAME: why` line per assertion; exits 1 on any FAIL.
"""
import math
import sys
import tomllib

import yaml

# Keys anarchon accepts in its TOML file (src/config.rs, KEYS).
KNOWN_KEYS = {
    "listen", "admin_listen", "data_dir", "backend", "peer", "peer_dns",
    "advertise", "heartbeat_ms", "expiry_ms", "lease_ms", "max_lease_ms",
    "max_late_ms", "max_attempts", "overlap", "max_wait_ms", "max_future_ms", "label",
    "retention_ms", "busy_timeout_ms", "drain_ms", "log_format",
    "max_runtimes", "max_frame_bytes", "watch_buffer", "tls_cert", "tls_key",
    "tls_client_ca", "mesh_secret_file", "auth_token_file",
    "max_request_bytes", "max_concurrent_per_connection",
    "max_holds_per_client", "max_links_per_peer", "worker_threads",
    "listen_unix", "listen_unix_group",
}

results = []


def check(name, cond, why=""):
    results.append((name, bool(cond), why))
    return bool(cond)


def merge(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def main():
    argv = sys.argv[1:]
    sub = None
    if argv[:1] == ["--subchart"]:
        sub, argv = argv[1], argv[2:]
    rendered, chart, *values_files = argv
    with open(f"{chart}/values.yaml") as f:
        values = yaml.safe_load(f)
    for vf in values_files:
        with open(vf) as f:
            over = yaml.safe_load(f) or {}
        merge(values, over.get(sub, {}) if sub else over)
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)

    sc = values["sidecar"]
    grpc_port, admin_port = sc["ports"]["grpc"], sc["ports"]["admin"]
    tls = bool(values["secrets"]["tls"]["name"])
    mesh = values["mesh"]["enabled"]

    # ConfigMap: anarchon.toml parses, holds only known keys, no secret.
    cms = by_kind.get("ConfigMap", [])
    check("one ConfigMap", len(cms) == 1, f"found {len(cms)}")
    toml_text = cms[0]["data"].get("anarchon.toml", "") if cms else ""
    try:
        cfg = tomllib.loads(toml_text)
    except tomllib.TOMLDecodeError as e:
        cfg = {}
        check("ConfigMap anarchon.toml is valid TOML", False, str(e))
    else:
        check("ConfigMap anarchon.toml is valid TOML", True)
    check("config has only anarchon's keys", set(cfg) <= KNOWN_KEYS,
          f"unknown: {sorted(set(cfg) - KNOWN_KEYS)}")
    bad_ints = [k for k, v in cfg.items() if isinstance(v, float)]
    check("config numbers are integers", not bad_ints, f"floats: {bad_ints}")
    want = {k: v for k, v in values["config"].items() if v is not None}
    check("config carries every config value", all(cfg.get(k) == v for k, v in want.items()),
          f"differs: {[(k, cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v]}")
    check("ConfigMap holds no password placeholder or secret",
          "$(" not in toml_text and "password" not in toml_text.lower())

    # The headless Service for --peer-dns.
    svcs = by_kind.get("Service", [])
    if mesh:
        check("one mesh Service", len(svcs) == 1, f"found {len(svcs)}")
        svc = svcs[0] if svcs else {"spec": {}, "metadata": {}}
        spec = svc["spec"]
        check("mesh Service is headless (clusterIP None)", spec.get("clusterIP") == "None")
        check("mesh Service publishes not-ready addresses", spec.get("publishNotReadyAddresses") is True)
        check("mesh Service exposes the gRPC port",
              [p.get("port") for p in spec.get("ports", [])] == [grpc_port])
        fqdn = (f"{svc['metadata'].get('name')}.{svc['metadata'].get('namespace')}"
                f".svc.{values['clusterDomain']}:{grpc_port}")
        check("peer_dns names the mesh Service", fqdn in cfg.get("peer_dns", []),
              f"{fqdn} not in {cfg.get('peer_dns')}")
    else:
        check("no mesh Service without the mesh", not svcs)
        check("no peer_dns without the mesh", not cfg.get("peer_dns"))

    deps = by_kind.get("Deployment", [])
    if not values["example"]["enabled"] and not sub:
        check("no example Deployment", not deps)
        return
    check("one Deployment", len(deps) == 1, f"found {len(deps)}")
    if not deps:
        return
    dep = deps[0]
    pod = dep["spec"]["template"]
    ps = pod["spec"]
    if mesh and svcs:
        sel = svcs[0]["spec"].get("selector", {})
        labels = pod["metadata"].get("labels", {})
        check("mesh Service selects the pods",
              sel and all(labels.get(k) == v for k, v in sel.items()), f"{sel} vs {labels}")

    native = sc["native"]
    where = ps.get("initContainers", []) if native else ps.get("containers", [])
    side = [c for c in where if c["name"] == sc["name"]]
    check(f"sidecar is in {'initContainers' if native else 'containers'}", len(side) == 1)
    if not side:
        return
    c = side[0]
    if native:
        check("native sidecar restarts Always", c.get("restartPolicy") == "Always")
    check("sidecar runs `serve --config`", c.get("args", [])[:2] ==
          ["serve", "--config=/etc/anarchon/config/anarchon.toml"], str(c.get("args")))
    check("no command override (the image's entrypoint is the binary)", "command" not in c)

    sec = c.get("securityContext", {})
    check("sidecar runAsNonRoot", sec.get("runAsNonRoot") is True)
    check("sidecar readOnlyRootFilesystem", sec.get("readOnlyRootFilesystem") is True)
    check("sidecar allowPrivilegeEscalation false", sec.get("allowPrivilegeEscalation") is False)
    check("sidecar drops ALL capabilities", sec.get("capabilities", {}).get("drop") == ["ALL"])
    check("sidecar seccomp RuntimeDefault",
          sec.get("seccompProfile", {}).get("type") == "RuntimeDefault")
    check("sidecar has resources", c.get("resources", {}).get("requests"))

    env = env_of(c)
    check("POD_IP from the downward API",
          env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP")
    names = [e["name"] for e in c.get("env", [])]
    adv = env.get("ANARCHON_ADVERTISE", {}).get("value", "")
    check("advertise is the pod IP and the gRPC port",
          adv == (sc["advertise"] or f"$(POD_IP):{grpc_port}"), adv)
    check("POD_IP is defined before ANARCHON_ADVERTISE uses it",
          "POD_IP" in names and names.index("POD_IP") < names.index("ANARCHON_ADVERTISE"))
    check("listens on the pod network",
          env.get("ANARCHON_LISTEN", {}).get("value") == f"{sc['listenHost']}:{grpc_port}"
          and env.get("ANARCHON_ADMIN_LISTEN", {}).get("value") == f"{sc['listenHost']}:{admin_port}")

    # Backend: a plain URL in the config, a secret one only through env.
    b = values["backend"]
    if b["urlSecret"]["name"]:
        ref = env.get("ANARCHON_BACKEND", {}).get("valueFrom", {}).get("secretKeyRef", {})
        check("backend URL from its Secret", ref == {"name": b["urlSecret"]["name"], "key": b["urlSecret"]["key"]})
        check("backend not in the ConfigMap", "backend" not in cfg)
    elif b["passwordSecret"]["name"]:
        ref = env.get("BACKEND_PASSWORD", {}).get("valueFrom", {}).get("secretKeyRef", {})
        check("backend password from its Secret",
              ref == {"name": b["passwordSecret"]["name"], "key": b["passwordSecret"]["key"]})
        check("BACKEND_PASSWORD is defined before ANARCHON_BACKEND",
              names.index("BACKEND_PASSWORD") < names.index("ANARCHON_BACKEND"))
        check("backend not in the ConfigMap", "backend" not in cfg)
    elif b["url"]:
        check("backend URL in the ConfigMap", cfg.get("backend") == b["url"])
    else:
        check("default backend: SQLite in the data dir", "backend" not in cfg and "ANARCHON_BACKEND" not in env)

    # Probes: gRPC health on the gRPC port, or HTTP on the admin port with TLS.
    kind = sc["probes"]["type"]
    if kind == "auto":
        kind = "http" if tls else "grpc"
    for p in ("startupProbe", "readinessProbe", "livenessProbe"):
        pr = c.get(p, {})
        if kind == "grpc":
            check(f"{p} is gRPC on the gRPC port", pr.get("grpc", {}).get("port") == grpc_port, str(pr))
        else:
            check(f"{p} is HTTP on the admin port", pr.get("httpGet", {}).get("port") == admin_port, str(pr))

    # Volumes: every mount has its volume; the data dir is an emptyDir.
    vols = {v["name"]: v for v in ps.get("volumes", [])}
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    check("every sidecar mount has a volume", all(n in vols for n in mounts.values()),
          f"missing: {[n for n in mounts.values() if n not in vols]}")
    data = vols.get(mounts.get(sc["dataDir"]), {})
    check("data dir is an emptyDir volume", "emptyDir" in data and env.get("ANARCHON_DATA_DIR", {}).get("value") == sc["dataDir"],
          str(data))
    check("/tmp is writable (emptyDir)", "emptyDir" in vols.get(mounts.get("/tmp"), {}))
    # The Unix socket (sidecar.unixSocket): bound in an emptyDir of its own.
    u = sc["unixSocket"]
    sock = f"{u['dir'].rstrip('/')}/{u['name']}"
    if u["enabled"]:
        check("socket path and mode passed to the sidecar",
              env.get("ANARCHON_LISTEN_UNIX", {}).get("value") == sock
              and env.get("ANARCHON_LISTEN_UNIX_GROUP", {}).get("value") == str(u["group"]).lower(),
              f"{env.get('ANARCHON_LISTEN_UNIX')} {env.get('ANARCHON_LISTEN_UNIX_GROUP')}")
        check("socket directory is an emptyDir of its own",
              mounts.get(u["dir"]) == "anarchon-socket" and "emptyDir" in vols.get("anarchon-socket", {}),
              f"{mounts} {vols.get('anarchon-socket')}")
        check("socket path fits sockaddr_un", len(sock.encode()) <= 107, sock)
    else:
        check("no Unix socket unless asked", "ANARCHON_LISTEN_UNIX" not in env and "anarchon-socket" not in vols)
    cmv = vols.get(mounts.get("/etc/anarchon/config"), {}).get("configMap", {}).get("name")
    check("config volume is the ConfigMap", cms and cmv == cms[0]["metadata"]["name"])

    # Secrets: mounted as files and passed with their flags.
    args = c.get("args", [])
    s = values["secrets"]
    for key, flag in (("meshSecret", "--mesh-secret-file="), ("authToken", "--auth-token-file=")):
        has = any(a.startswith(flag) for a in args)
        check(f"{flag[2:-1]} flag iff secrets.{key}", has == bool(s[key]["name"]))
    check("TLS flags iff secrets.tls", any(a.startswith("--tls-cert=") for a in args) == tls)
    if s["meshSecret"]["name"] or s["authToken"]["name"] or tls:
        srcs = vols.get("anarchon-secrets", {}).get("projected", {}).get("sources", [])
        got = {x["secret"]["name"] for x in srcs}
        want = {s[k]["name"] for k in ("meshSecret", "authToken", "tls") if s[k]["name"]}
        check("secret volume projects the referenced Secrets", got == want, f"{got} vs {want}")
        paths = {it["path"] for x in srcs for it in x["secret"]["items"]}
        flagged = {a.split("=", 1)[1].rsplit("/", 1)[1] for a in args
                   if a.startswith(("--mesh-secret-file=", "--auth-token-file=", "--tls-"))}
        check("every secret flag points at a projected file", flagged <= paths, f"{flagged} vs {paths}")

    # Shutdown: the grace period covers the preStop sleep and the drain.
    pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    drain = math.ceil((values["config"].get("drain_ms") or 5000) / 1000)
    grace = ps.get("terminationGracePeriodSeconds", 30)
    check("grace period exceeds preStop + drain", grace > pre + drain, f"{grace} <= {pre} + {drain}")
    if not native:
        check("plain sidecar sleeps in preStop (no shell needed)", pre > 0 and "exec" not in c.get("lifecycle", {}).get("preStop", {}))

    ann = pod["metadata"].get("annotations", {})
    if values["metrics"]["scrapeAnnotations"]:
        check("Prometheus scrapes the admin port",
              ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(admin_port))
    check("config checksum annotation", "checksum/anarchon-config" in ann)
    ports = {p["containerPort"] for p in c.get("ports", [])}
    check("sidecar declares its two ports", ports == {grpc_port, admin_port})
    if sub:
        return
    apps = [cc for cc in ps.get("containers", []) if cc["name"] != sc["name"]]
    app_env = {e["name"]: e for cc in apps for e in cc.get("env", [])}
    server = app_env.get("ANARCHON_SERVER", {}).get("value")
    if not u["enabled"]:
        check("app finds the sidecar on loopback", server == f"127.0.0.1:{grpc_port}", server)
        return
    check("app dials the sidecar's Unix socket", server == f"unix:{sock}", f"{server} vs unix:{sock}")
    app_mounts = {m["mountPath"]: m["name"] for cc in apps for m in cc.get("volumeMounts", [])}
    check("app mounts the socket's emptyDir at the same path",
          app_mounts.get(u["dir"]) == mounts.get(u["dir"]) == "anarchon-socket", f"{app_mounts} / {mounts}")


if __name__ == "__main__":
    main()
    for name, good, why in results:
        print(f"ok {name}" if good else f"FAIL {name}: {why}")
    sys.exit(0 if all(g for _, g, _ in results) else 1)
