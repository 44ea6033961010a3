//! Mesh process tests with heartbeat 200 ms and expiry 1,500 ms. Every
//! timing assertion checks both bounds.

mod common;

use std::collections::HashMap;

use std::time::{Duration, Instant};

use anarchon::mesh::Identity;
use anarchon::proto as pb;
use common::mesh::{client as mesh_client, list, mid_beat, record, until, Events};
use common::process::{free_addr, Sidecar};
use common::proxy::FaultProxy;

/// These tests measure time: they take turns so that one test's nine
/// processes do not starve another's.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const HB: u64 = 200;
const EXPIRY: u64 = 1500;

fn timing() -> Vec<String> {
    vec![
        "--heartbeat-ms".into(),
        HB.to_string(),
        "--expiry-ms".into(),
        EXPIRY.to_string(),
    ]
}

fn state_of(l: &pb::ListPeersResponse, node: &str) -> Option<(pb::PeerState, pb::Link, u64, u32)> {
    l.peers.iter().find(|p| p.node == node).map(|p| {
        (
            pb::PeerState::try_from(p.state).unwrap(),
            pb::Link::try_from(p.link).unwrap(),
            p.instance,
            p.restarts,
        )
    })
}

fn first(ev: &Events, kind: pb::PeerEventKind, node: &str, after: Instant) -> Option<Instant> {
    ev.lock()
        .unwrap()
        .iter()
        .find(|s| s.kind == kind && s.peer.node == node && s.at >= after)
        .map(|s| s.at)
}

fn node_of(dir: &std::path::Path) -> String {
    // Creating the identity first tells the test the node id in advance.
    Identity::load_or_create(dir).unwrap().node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_sidecar_expires_and_its_restart_rejoins_as_the_same_runtime() {
    let _turn = TURN.lock().await;
    let root = tempfile::tempdir().unwrap();
    let addrs: Vec<_> = (0..3).map(|_| free_addr()).collect();
    let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
    let nodes: Vec<String> = dirs.iter().map(|d| node_of(d)).collect();
    let mut sidecars: Vec<Sidecar> = (0..3)
        .map(|i| {
            let mut flags = timing();
            // One store for the whole mesh (sidecars on different stores refuse to link).
            flags.extend([
                "--backend".into(),
                format!("sqlite://{}", root.path().join("shared.db").display()),
            ]);
            common::mesh::start_in_mesh(&dirs[i], &addrs, i, flags)
        })
        .collect();
    // Everyone sees everyone.
    for (i, &addr) in addrs.iter().enumerate() {
        let ok = until(Duration::from_secs(10), || async {
            let l = list(addr).await;
            (0..3).filter(|&j| j != i).all(|j| {
                matches!(
                    state_of(&l, &nodes[j]),
                    Some((pb::PeerState::Alive, pb::Link::Direct, _, 0))
                )
            })
        })
        .await;
        assert!(
            ok.is_some(),
            "mesh did not form at {i}: {:?}",
            list(addrs[i]).await
        );
    }
    let watch1 = record(addrs[1], true).await.0;
    let watch2 = record(addrs[2], true).await.0;
    let old_instance = state_of(&list(addrs[1]).await, &nodes[0]).unwrap().2;

    // SIGKILL runtime 0, between two of its beats.
    mid_beat(addrs[0], Duration::from_millis(HB)).await;
    let killed = Instant::now();
    sidecars[0].kill();
    let lo = Duration::from_millis(EXPIRY - HB);
    let hi = Duration::from_millis(EXPIRY + 2 * HB + 500);
    for (i, watch) in [(1, &watch1), (2, &watch2)] {
        let seen = until(hi + Duration::from_secs(1), || async {
            matches!(
                state_of(&list(addrs[i]).await, &nodes[0]),
                Some((pb::PeerState::Expired, ..))
            )
        })
        .await
        .expect("never listed EXPIRED");
        let via_list = seen.duration_since(killed);
        // The event is published by the next tick (a quarter heartbeat).
        until(Duration::from_secs(1), || async {
            first(watch, pb::PeerEventKind::Expired, &nodes[0], killed).is_some()
        })
        .await
        .expect("no EXPIRED event");
        let via_watch = first(watch, pb::PeerEventKind::Expired, &nodes[0], killed)
            .unwrap()
            .duration_since(killed);
        for (how, t) in [("ListPeers", via_list), ("WatchPeers", via_watch)] {
            assert!(
                t >= lo && t <= hi,
                "{how} at survivor {i}: expired after {t:?}, want [{lo:?}, {hi:?}]"
            );
        }
        // Still listed exactly once; the survivor did not expire.
        let l = list(addrs[i]).await;
        assert_eq!(l.peers.iter().filter(|p| p.node == nodes[0]).count(), 1);
    }

    // Restart it with the same data dir: same node, new instance, restarts = 1.
    // (The new instance may link before `restart` returns, so events count
    // from the kill.)
    sidecars[0].restart();
    for (i, watch) in [(1, &watch1), (2, &watch2)] {
        let ok = until(Duration::from_secs(10), || async {
            matches!(state_of(&list(addrs[i]).await, &nodes[0]), Some((pb::PeerState::Alive, _, inst, 1)) if inst > old_instance)
        })
        .await;
        assert!(
            ok.is_some(),
            "restart not seen at {i}: {:?}",
            list(addrs[i]).await
        );
        let l = list(addrs[i]).await;
        assert_eq!(
            l.peers.iter().filter(|p| p.node == nodes[0]).count(),
            1,
            "listed once"
        );
        let ev = until(Duration::from_secs(1), || async {
            first(watch, pb::PeerEventKind::Restarted, &nodes[0], killed).is_some()
        })
        .await;
        assert!(ev.is_some(), "no RESTARTED event at {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_runtime_stays_alive_through_a_relay_and_expires_when_cut_off() {
    let _turn = TURN.lock().await;
    let root = tempfile::tempdir().unwrap();
    let addrs: Vec<_> = (0..3).map(|_| free_addr()).collect();
    let dirs: Vec<_> = (0..3).map(|i| root.path().join(format!("n{i}"))).collect();
    let nodes: Vec<String> = dirs.iter().map(|d| node_of(d)).collect();
    let mut proxies = Vec::new();
    for a in &addrs {
        proxies.push(FaultProxy::start(*a, nodes.clone()).await);
    }
    let (a, b, c) = (0, 1, 2);
    let _sidecars: Vec<Sidecar> = (0..3)
        .map(|i| {
            let mut flags = timing();
            // One store for the whole mesh (sidecars on different stores refuse to link).
            flags.extend([
                "--backend".into(),
                format!("sqlite://{}", root.path().join("shared.db").display()),
            ]);
            flags.extend(["--advertise".into(), proxies[i].addr.to_string()]);
            let through: Vec<_> = proxies.iter().map(|p| p.addr).collect();
            flags.extend(common::mesh::peer_flags(&through, i));
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            Sidecar::start_at(&dirs[i], addrs[i], &flags)
        })
        .collect();
    let all_direct = until(Duration::from_secs(10), || async {
        let l = list(addrs[a]).await;
        matches!(
            state_of(&l, &nodes[c]),
            Some((pb::PeerState::Alive, pb::Link::Direct, _, _))
        ) && matches!(
            state_of(&l, &nodes[b]),
            Some((pb::PeerState::Alive, pb::Link::Direct, _, _))
        )
    })
    .await;
    assert!(all_direct.is_some(), "{:?}", list(addrs[a]).await);
    let instance_c = state_of(&list(addrs[a]).await, &nodes[c]).unwrap().2;
    let watch_a = record(addrs[a], true).await.0;
    let watch_b = record(addrs[b], true).await.0;

    // Cut A–C. C stays ALIVE at A through B, shown as RELAYED.
    proxies[c].block(&nodes[a]);
    proxies[a].block(&nodes[c]);
    let cut = Instant::now();
    let relayed = until(Duration::from_millis(EXPIRY * 2), || async {
        matches!(
            state_of(&list(addrs[a]).await, &nodes[c]),
            Some((pb::PeerState::Alive, pb::Link::Relayed, _, _))
        )
    })
    .await;
    assert!(
        relayed.is_some(),
        "C not RELAYED at A: {:?}",
        list(addrs[a]).await
    );
    // Hold the partition past one expiry: C must never expire at A.
    tokio::time::sleep(Duration::from_millis(EXPIRY)).await;
    assert!(matches!(
        state_of(&list(addrs[a]).await, &nodes[c]),
        Some((pb::PeerState::Alive, pb::Link::Relayed, _, _))
    ));
    assert!(
        first(&watch_a, pb::PeerEventKind::Expired, &nodes[c], cut).is_none(),
        "C expired at A despite the relay"
    );

    // Cut C off entirely: it expires at A and at B within the bound (one
    // extra heartbeat per relay hop).
    proxies[c].block(&nodes[b]);
    proxies[b].block(&nodes[c]);
    let isolated = Instant::now();
    let lo = Duration::from_millis(EXPIRY - HB);
    let hi = Duration::from_millis(EXPIRY + 2 * HB + 500);
    for (name, w) in [("A", &watch_a), ("B", &watch_b)] {
        let t = until(hi + Duration::from_secs(1), || async {
            first(w, pb::PeerEventKind::Expired, &nodes[c], isolated).is_some()
        })
        .await
        .map(|_| {
            first(w, pb::PeerEventKind::Expired, &nodes[c], isolated)
                .unwrap()
                .duration_since(isolated)
        })
        .unwrap_or_else(|| panic!("C never expired at {name}"));
        assert!(
            t >= lo && t <= hi,
            "C expired at {name} after {t:?}, want [{lo:?}, {hi:?}]"
        );
    }

    // Heal: C is ALIVE again, same instance, no restart counted.
    for (x, y) in [(a, c), (c, a), (b, c), (c, b)] {
        proxies[x].unblock(&nodes[y]);
    }
    for i in [a, b] {
        let back = until(Duration::from_secs(10), || async {
            matches!(state_of(&list(addrs[i]).await, &nodes[c]), Some((pb::PeerState::Alive, _, inst, 0)) if inst == instance_c)
        })
        .await;
        assert!(
            back.is_some(),
            "C did not come back at {i}: {:?}",
            list(addrs[i]).await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_forged_and_oversized_frames_are_dropped_and_counted() {
    let _turn = TURN.lock().await;
    use anarchon::mesh::marks::{sign_hello, sign_mark};
    let root = tempfile::tempdir().unwrap();
    let addrs: Vec<_> = (0..2).map(|_| free_addr()).collect();
    let dirs: Vec<_> = (0..2).map(|i| root.path().join(format!("n{i}"))).collect();
    let nodes: Vec<String> = dirs.iter().map(|d| node_of(d)).collect();
    let sidecars: Vec<Sidecar> = (0..2)
        .map(|i| {
            let mut flags = timing();
            // One store for the whole mesh (sidecars on different stores refuse to link).
            flags.extend([
                "--backend".into(),
                format!("sqlite://{}", root.path().join("shared.db").display()),
            ]);
            flags.extend(["--peer".into(), addrs[1 - i].to_string()]);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            Sidecar::start_at(&dirs[i], addrs[i], &flags)
        })
        .collect();
    let formed = until(Duration::from_secs(10), || async {
        matches!(
            state_of(&list(addrs[0]).await, &nodes[1]),
            Some((pb::PeerState::Alive, ..))
        )
    })
    .await;
    assert!(formed.is_some());

    let target = addrs[0];
    let sync = |frames: Vec<pb::SyncFrame>| async move {
        let mut c = mesh_client(target).await;
        c.sync(tokio_stream::iter(frames)).await
    };
    // 1. The first frame is not a hello.
    let st = sync(vec![pb::SyncFrame {
        frame: Some(pb::sync_frame::Frame::Marks(pb::Marks::default())),
    }])
    .await
    .unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument);
    // 2. A hello whose proof does not verify.
    let intruder = Identity::ephemeral(1);
    let mut bad = sign_hello(&intruder, "127.0.0.1:1", None);
    bad.instance += 1;
    let st = sync(vec![pb::SyncFrame {
        frame: Some(pb::sync_frame::Frame::Hello(bad)),
    }])
    .await
    .unwrap_err();
    assert_eq!(st.code(), tonic::Code::PermissionDenied);
    // 3. A valid hello followed by forged marks: a beat for node 1 signed
    //    by the intruder, a mark about the sidecar itself, and a mark whose
    //    signature was altered.
    let mut stolen = sign_mark(&intruder, 99, false, "x", &Default::default());
    stolen.node = nodes[1].clone();
    let mut about_self = sign_mark(&intruder, 1, false, "x", &Default::default());
    about_self.node = nodes[0].clone();
    let mut altered = sign_mark(&intruder, 5, false, "x", &Default::default());
    altered.beat = 6;
    let frames = vec![
        pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Hello(sign_hello(
                &intruder,
                "127.0.0.1:1",
                None,
            ))),
        },
        pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Marks(pb::Marks {
                marks: vec![stolen, about_self, altered],
                ..Default::default()
            })),
        },
        pb::SyncFrame { frame: None },
    ];
    let mut c = mesh_client(target).await;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    for f in frames {
        tx.send(f).await.unwrap();
    }
    let mut resp = c
        .sync(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        resp.message().await.unwrap().unwrap().frame,
        Some(pb::sync_frame::Frame::Hello(_))
    ));
    // 4. An oversized frame (the limit is 4 MiB by default).
    let mut huge = sign_mark(&intruder, 7, false, "x", &Default::default());
    huge.address = "y".repeat(5 << 20);
    let _ = tx
        .send(pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Marks(pb::Marks {
                marks: vec![huge],
                ..Default::default()
            })),
        })
        .await;
    drop(tx);
    while let Ok(Some(_)) = resp.message().await {}

    // Everything was refused and counted, and the mesh keeps working.
    let state = until(Duration::from_secs(5), || async {
        let body = common::http_get(sidecars[0].admin, "/api/v1/mesh/state", None).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let r = &v["refused"];
        r["no_hello"].as_u64() >= Some(1)
            && r["bad_proof"].as_u64() >= Some(1)
            && r["key_mismatch"].as_u64() >= Some(1)
            && r["bad_signature"].as_u64() >= Some(1)
            && r["malformed"].as_u64() >= Some(1)
            && r["frame_too_large"].as_u64() >= Some(1)
    })
    .await;
    assert!(
        state.is_some(),
        "{}",
        common::http_get(sidecars[0].admin, "/api/v1/mesh/state", None).await
    );
    let l = list(addrs[0]).await;
    assert!(
        matches!(
            state_of(&l, &nodes[1]),
            Some((pb::PeerState::Alive, pb::Link::Direct, _, _))
        ),
        "{l:?}"
    );
    let p1 = l.peers.iter().find(|p| p.node == nodes[1]).unwrap();
    assert!(p1.beat < 99, "a forged beat was accepted");
    // A healthy two-node mesh echoes nobody's own beat back as a refusal
    // (issue 20: `about_self` rose about once a second).
    let body = common::http_get(sidecars[0].admin, "/api/v1/mesh/state", None).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(
        v["refused"]["about_self"].as_u64().unwrap_or(0),
        0,
        "{body}"
    );
    let metrics = common::http_get(sidecars[0].admin, "/metrics", None).await;
    assert!(
        metrics.contains("anarchon_mesh_refused_total{reason=\"bad_signature\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("anarchon_peers{state=\"ALIVE\"}"),
        "{metrics}"
    );
}

#[allow(unused)]
/// The README's old mesh example: two sidecars with a SQLite file each,
/// `--peer` each other. They do not share claims, so they must not form one
/// mesh: each refuses the other's hello (`store_mismatch`), lists it as
/// refused with its store identity (never as a peer), counts the refusal,
/// answers `/readyz` with 503 naming both identities, and logs an error.
///
/// What the mesh cannot do is make two stores agree: `claim` of the same
/// job still answers `WON` on each store (asserted below, so that the docs
/// say exactly this). The split is now loud instead of silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sidecars_on_different_stores_refuse_to_link_and_say_so() {
    let _turn = TURN.lock().await;
    let root = tempfile::tempdir().unwrap();
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let args = |peer: std::net::SocketAddr| {
        let mut v = timing();
        v.extend(["--peer".to_string(), peer.to_string()]);
        v
    };
    let (args_a, args_b) = (args(b_addr), args(a_addr));
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let a = Sidecar::start_at(&root.path().join("a"), a_addr, &refs(&args_a));
    let b = Sidecar::start_at(&root.path().join("b"), b_addr, &refs(&args_b));
    let node = |l: &pb::ListPeersResponse| l.self_.as_ref().unwrap().node.clone();
    let (node_a, node_b) = (node(&list(a_addr).await), node(&list(b_addr).await));
    let refused_by = |addr, other: String| async move {
        list(addr)
            .await
            .refused
            .iter()
            .any(|r| r.node == other && r.reason == "store_mismatch")
    };
    until(Duration::from_secs(10), || async {
        refused_by(a_addr, node_b.clone()).await && refused_by(b_addr, node_a.clone()).await
    })
    .await
    .expect("both sidecars refuse the other");
    // Let a few redials happen: the other never becomes a peer.
    tokio::time::sleep(Duration::from_millis(3 * HB)).await;
    let (la, lb) = (list(a_addr).await, list(b_addr).await);
    assert!(la.store_identity.starts_with("sqlite:"), "{la:?}");
    assert!(lb.store_identity.starts_with("sqlite:"), "{lb:?}");
    assert_ne!(la.store_identity, lb.store_identity);
    assert_eq!(la.refused[0].store_identity, lb.store_identity);
    assert_eq!(lb.refused[0].store_identity, la.store_identity);
    assert!(la.peers.iter().all(|p| p.node != node_b), "{la:?}");
    assert!(lb.peers.iter().all(|p| p.node != node_a), "{lb:?}");

    for (s, ours, theirs) in [(&a, &la, &lb), (&b, &lb, &la)] {
        let metrics = common::http_get(s.admin, "/metrics", None).await;
        let refused: u64 = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("anarchon_mesh_refused_total{reason=\"store_mismatch\"} ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        assert!(refused >= 1, "{metrics}");
        let ready = common::http_get(s.admin, "/readyz", None).await;
        assert!(ready.starts_with("not ready"), "{ready}");
        assert!(ready.contains("store_mismatch"), "{ready}");
        assert!(ready.contains(&ours.store_identity), "{ready}");
        assert!(ready.contains(&theirs.store_identity), "{ready}");
        let log = std::fs::read_to_string(&s.log).unwrap();
        assert!(log.contains("refused a peer on another store"), "{log}");
        assert!(log.contains(&theirs.store_identity), "{log}");
        let out = std::process::Command::new(common::process::BIN)
            .args(["peers", "--server", &s.addr.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("REFUSED"), "{text}");
        assert!(text.contains("store_mismatch"), "{text}");
    }

    // Two stores, two winners: the mesh cannot prevent this, it reports it.
    for s in [&a, &b] {
        let out = std::process::Command::new(common::process::BIN)
            .args(["claim", "same-job", "--server", &s.addr.to_string()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}

/// A copied data dir (node key *and* instance counter) runs the same
/// runtime twice. A third sidecar relays each one's marks to the other; the
/// one that sees its own node and instance beating from another address
/// reports it: an error in the log, `anarchon_mesh_duplicate_node_key 1`,
/// and a line in `peers`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copied_node_key_is_reported_as_a_duplicate() {
    let _turn = TURN.lock().await;
    let root = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (root.path().join("a"), root.path().join("b"));
    node_of(&dir_a);
    std::fs::create_dir_all(&dir_b).unwrap();
    for f in ["node.key", "instance"] {
        std::fs::copy(dir_a.join(f), dir_b.join(f)).unwrap();
    }
    let c_addr = free_addr();
    let mut t = timing();
    // One store for the mesh (sidecars on different stores refuse to link).
    t.extend([
        "--backend".to_string(),
        format!("sqlite://{}", root.path().join("shared.db").display()),
    ]);
    let refs: Vec<&str> = t.iter().map(String::as_str).collect();
    let c_car = Sidecar::start_at(&root.path().join("c"), c_addr, &refs);
    let c = c_addr.to_string();
    let with_peer = [&refs[..], &["--peer", c.as_str()][..]].concat();
    let a = Sidecar::start(&dir_a, &with_peer);
    let b = Sidecar::start(&dir_b, &with_peer);
    if until(Duration::from_secs(10), || async {
        list(a.addr).await.duplicate_node_key || list(b.addr).await.duplicate_node_key
    })
    .await
    .is_none()
    {
        for s in [&a, &b, &c_car] {
            eprintln!(
                "{}",
                common::http_get(s.admin, "/api/v1/mesh/state", None).await
            );
        }
        panic!("one of the twins reports the duplicate node key");
    }
    let twin = if list(a.addr).await.duplicate_node_key {
        &a
    } else {
        &b
    };
    let l = list(twin.addr).await;
    assert_eq!(l.duplicate_instance, l.self_.as_ref().unwrap().instance);
    let metrics = common::http_get(twin.admin, "/metrics", None).await;
    assert!(
        metrics.contains("anarchon_mesh_duplicate_node_key 1"),
        "{metrics}"
    );
    let log = std::fs::read_to_string(&twin.log).unwrap();
    assert!(
        log.contains("another process is running with this node key"),
        "{log}"
    );
    let out = std::process::Command::new(common::process::BIN)
        .args(["peers", "--server", &twin.addr.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("duplicate node key"), "{text}");
}

fn _unused(_: HashMap<(), ()>) {}
