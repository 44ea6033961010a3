//! `<data_dir>/peers.json`: who was there before a restart (SPEC §4.2:
//! reloading restores *who*, never freshness). Forgotten runtimes are not
//! in the table, so they leave the file at the next write. The mesh writes
//! it every 5 heartbeats when it changed, and once more when it stops.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::identity::{write_atomic, IdentityError};
use super::node::{lock, Mesh};
use crate::proto as pb;

pub const PEERS_FILE: &str = "peers.json";

/// What is persisted about a known runtime: its last signed mark.
#[derive(Debug, Serialize, Deserialize)]
struct KnownPeer {
    node: String,
    instance: u64,
    beat: u64,
    left: bool,
    address: String,
    public_key: String,
    signature: String,
    labels: BTreeMap<String, String>,
}

/// The file's text for these marks (sorted by node, so that an unchanged
/// view gives the same text and is not written again).
pub fn encode(mut marks: Vec<pb::Mark>) -> Option<String> {
    marks.sort_by(|a, b| a.node.cmp(&b.node));
    let known: Vec<KnownPeer> = marks
        .into_iter()
        .map(|m| KnownPeer {
            node: m.node,
            instance: m.instance,
            beat: m.beat,
            left: m.left,
            address: m.address,
            public_key: hex::encode(m.public_key),
            signature: hex::encode(m.signature),
            labels: m.labels.into_iter().collect(),
        })
        .collect();
    serde_json::to_string_pretty(&known).ok()
}

/// Writes the file atomically.
pub fn save(dir: &Path, text: &str) -> Result<(), IdentityError> {
    write_atomic(&dir.join(PEERS_FILE), text.as_bytes(), 0o644)
}

/// The marks in the file; none if it is missing or malformed (logged).
pub fn load(dir: &Path) -> Vec<pb::Mark> {
    let Ok(text) = std::fs::read_to_string(dir.join(PEERS_FILE)) else {
        return Vec::new();
    };
    let known: Vec<KnownPeer> = match serde_json::from_str(&text) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a malformed {PEERS_FILE}");
            return Vec::new();
        }
    };
    known
        .into_iter()
        .filter_map(|k| {
            Some(pb::Mark {
                node: k.node,
                instance: k.instance,
                beat: k.beat,
                signature: hex::decode(k.signature).ok()?,
                public_key: hex::decode(k.public_key).ok()?,
                address: k.address,
                labels: k.labels.into_iter().collect(),
                age_ms: 0,
                left: k.left,
            })
        })
        .collect()
}

impl Mesh {
    pub(super) async fn persist_loop(self: Arc<Self>) {
        let mut every = tokio::time::interval(self.cfg.heartbeat * 5);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = self.stop.clone();
        let mut last = String::new();
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = stop.changed() => {}
            }
            let marks = lock(&self.table).known_marks();
            if let Some(text) = encode(marks) {
                if text != last {
                    if let Err(e) = save(&self.cfg.data_dir, &text) {
                        tracing::warn!(error = %e, "cannot persist known peers");
                    }
                    last = text;
                }
            }
            if self.stopped() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::identity::Identity;
    use crate::mesh::marks::{sign_mark, verify_mark};

    #[test]
    fn marks_round_trip_and_a_bad_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Identity::ephemeral(2), Identity::ephemeral(5));
        let marks = vec![
            sign_mark(&b, 9, true, "b:1", &Default::default()),
            sign_mark(
                &a,
                3,
                false,
                "a:1",
                &BTreeMap::from([("zone".into(), "x".into())]),
            ),
        ];
        let text = encode(marks.clone()).unwrap();
        assert_eq!(
            Some(text.clone()),
            encode(marks.into_iter().rev().collect())
        );
        save(dir.path(), &text).unwrap();
        let back = load(dir.path());
        assert_eq!(back.len(), 2);
        assert!(back.iter().all(|m| verify_mark(m).is_ok()));
        assert!(back.iter().any(|m| m.left && m.node == b.node));
        save(dir.path(), &encode(Vec::new()).unwrap()).unwrap();
        assert!(load(dir.path()).is_empty());
        std::fs::write(dir.path().join(PEERS_FILE), "{not json").unwrap();
        assert!(load(dir.path()).is_empty());
    }
}
