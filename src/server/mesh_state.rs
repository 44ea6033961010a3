//! The mesh as people read it: `/api/v1/mesh/state`, and one runtime as
//! JSON for the dashboard and the `peers`/`watch` commands. The mesh hands
//! over plain data ([`Mesh::list`], [`Mesh::link_status`],
//! [`Mesh::table_stats`]); the formatting lives here.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::mesh::node::LinkStatus;
use crate::mesh::Mesh;
use crate::proto as pb;

/// Machine-readable mesh state for `/api/v1/mesh/state`.
pub fn state_json(mesh: &Mesh) -> serde_json::Value {
    let now = Instant::now();
    let cfg = mesh.config();
    let list = mesh.list();
    let links: Vec<_> = mesh
        .link_status(now)
        .iter()
        .map(|l| {
            serde_json::json!({
                "node": l.node, "address": l.address,
                "direction": if l.outbound { "outbound" } else { "inbound" },
                "state": link_state(l, cfg.expiry),
                "last_rx_ms": l.quiet.as_millis() as u64,
            })
        })
        .collect();
    let stats = mesh.table_stats();
    let drops: BTreeMap<&str, u64> = stats.drops.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    serde_json::json!({
        "self": list.self_.as_ref().map(peer_json),
        "peers": list.peers.iter().map(peer_json).collect::<Vec<_>>(),
        "links": links,
        "refused": drops,
        "beats_accepted": stats.beats_accepted,
        "duplicate_node_key": stats.duplicate_node_key,
        "duplicate_instance": stats.duplicate_instance,
        "store_identity": cfg.store_identity,
        "refused_peers": mesh.refused_peers(now).iter().map(|r| serde_json::json!({
            "node": r.node, "address": r.address, "reason": r.reason,
            "store_identity": r.store_identity, "age_ms": r.age_ms,
        })).collect::<Vec<_>>(),
        "sent_bytes": mesh.sent_bytes(),
        "max_links": cfg.max_links,
        "chosen": mesh.chosen(),
        "heartbeat_ms": cfg.heartbeat.as_millis() as u64,
        "expiry_ms": cfg.expiry.as_millis() as u64,
    })
}

/// A link's state as the admin endpoints and the metrics name it:
/// `UNREACHABLE` when nothing arrived for half an expiry, else `CONNECTED`.
pub fn link_state(l: &LinkStatus, expiry: Duration) -> &'static str {
    if l.quiet > expiry / 2 {
        "UNREACHABLE"
    } else {
        "CONNECTED"
    }
}

/// One runtime as JSON, as `/api/v1/mesh/state`, the dashboard and the
/// `peers`/`watch` commands (see `cli::client`) show it.
pub fn peer_json(p: &pb::Peer) -> serde_json::Value {
    serde_json::json!({
        "node": p.node, "instance": p.instance, "restarts": p.restarts,
        "address": p.address,
        "state": peer_state_name(p.state),
        "link": link_name(p.link),
        "beat": p.beat, "beat_age_ms": p.beat_age_ms, "labels": p.labels,
    })
}

/// A peer state's name without its prefix (`ALIVE`), `?` if unknown.
pub fn peer_state_name(state: i32) -> &'static str {
    pb::PeerState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("PEER_STATE_"))
        .unwrap_or("?")
}

/// A link kind's name without its prefix (`DIRECT`), `?` if unknown.
pub fn link_name(link: i32) -> &'static str {
    pb::Link::try_from(link)
        .map(|s| s.as_str_name().trim_start_matches("LINK_"))
        .unwrap_or("?")
}
