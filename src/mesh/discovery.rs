//! Discovery and dialling: the addresses to dial (`--peer`, `--peer-dns`
//! re-resolved every 5 heartbeats, and the runtimes [`fanout`] chooses among
//! those learned from gossip), one dial loop per address with the
//! [`Redial`] backoff, and the client side of the hello exchange.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::dial::Redial;
use super::fanout;
use super::gossip::GossipConfig;
use super::marks::verify_hello;
use super::node::{clock_now, lock, Mesh};
use crate::error::{dial_refusal, DialRefusal};
use crate::proto as pb;

/// Random links are drawn again every this many heartbeats.
const RESHUFFLE_HEARTBEATS: u32 = 30;
/// The higher node id of a linked pair dials too once the link has heard
/// nothing for this many heartbeats (SPEC §4.3).
const REDIAL_QUIET_HEARTBEATS: u32 = 3;

impl Mesh {
    /// Records a failed dial of a configured address (logged once per
    /// address at warn, then at debug).
    fn note_unreachable(&self, addr: &str, error: &str) {
        let configured = self.cfg.peers.iter().any(|p| p == addr) || lock(&self.dns).contains(addr);
        if !configured {
            return;
        }
        let first = lock(&self.unreachable)
            .insert(addr.to_owned(), error.to_owned())
            .is_none();
        if first {
            tracing::warn!(%addr, %error, "configured peer is unreachable; retrying");
        }
    }

    pub(super) async fn discovery_loop(self: Arc<Self>) {
        let mut every = tokio::time::interval(self.cfg.heartbeat);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u64 = 0;
        let mut stop = self.stop.clone();
        loop {
            // Woken between heartbeats when a link went silent: choose and
            // dial again now (a heartbeat of waiting is a heartbeat more of
            // age on every copy that link fed us).
            let heartbeat = tokio::select! {
                _ = every.tick() => true,
                _ = self.rechoose.notified() => false,
                _ = stop.changed() => return,
            };
            if heartbeat && n.is_multiple_of(5) {
                self.resolve_dns().await;
            }
            self.choose_links(n / u64::from(RESHUFFLE_HEARTBEATS));
            if heartbeat {
                n += 1;
            }
            for addr in self.desired_addresses() {
                let fresh = lock(&self.dialing).insert(addr.clone());
                if fresh {
                    tokio::spawn(self.clone().dial_loop(addr));
                }
            }
        }
    }

    async fn resolve_dns(&self) {
        let mut found = HashSet::new();
        for name in &self.cfg.peer_dns {
            match tokio::net::lookup_host(name.as_str()).await {
                Ok(addrs) => found.extend(addrs.map(|a| a.to_string())),
                Err(e) => tracing::debug!(name = %name, error = %e, "peer dns lookup failed"),
            }
        }
        *lock(&self.dns) = found;
    }

    /// Recomputes the runtimes we dial ([`fanout::choose`]): among the live
    /// ones by rendezvous hashing plus a few at random (drawn again every
    /// [`RESHUFFLE_HEARTBEATS`]); plus one runtime seen within ten expiries
    /// but not live now (restored from disk, or beyond a partition), so a
    /// split mesh and a restarted one find each other again.
    pub(super) fn choose_links(&self, epoch: u64) {
        let now = clock_now();
        let horizon = self.cfg.expiry * 10;
        let silent = self.silent_links(now);
        let (live, recent) = {
            let table = lock(&self.table);
            let mut live = Vec::new();
            let mut recent = Vec::new();
            for p in table.peers(now) {
                if p.address.is_empty() {
                    continue;
                }
                match pb::PeerState::try_from(p.state) {
                    Ok(pb::PeerState::Alive | pb::PeerState::Unreachable)
                        if !silent.contains(&p.node) =>
                    {
                        live.push(p.node)
                    }
                    Ok(pb::PeerState::Expired)
                        if p.beat_age_ms < 0 || (p.beat_age_ms as u128) < horizon.as_millis() =>
                    {
                        recent.push(p.node)
                    }
                    _ => {}
                }
            }
            (live, recent)
        };
        let mut chosen = fanout::choose(
            &self.id.node,
            live.iter().map(String::as_str),
            self.cfg.max_links,
            epoch,
        );
        chosen.extend(
            fanout::choose(&self.id.node, recent.iter().map(String::as_str), 1, epoch)
                .into_iter()
                .take(1),
        );
        *lock(&self.chosen) = chosen.into_iter().collect();
    }

    /// The runtimes whose links have all been silent for `silent_after`
    /// (1½ heartbeats, [`GossipConfig`]). They are not chosen until heard
    /// again: a runtime whose links a partition cut dials others within two
    /// heartbeats (the beat loop wakes this loop as soon as a link goes
    /// silent) — before its view of its own side ages to `UNREACHABLE` —
    /// instead of waiting one expiry for the links to end.
    pub(super) fn silent_links(&self, now: std::time::Instant) -> HashSet<String> {
        let quiet = GossipConfig::new(self.cfg.heartbeat, self.cfg.expiry).silent_after;
        self.links_heard()
            .into_iter()
            .filter(|(_, t)| now.saturating_duration_since(*t) >= quiet)
            .map(|(n, _)| n.to_owned())
            .collect()
    }

    /// Addresses to dial: the chosen runtimes', and the configured ones
    /// (`--peer`, DNS) while fewer chosen links are up than wanted.
    fn desired_addresses(&self) -> HashSet<String> {
        let chosen: Vec<String> = lock(&self.chosen).iter().cloned().collect();
        let linked: HashSet<String> = lock(&self.links).values().map(|l| l.node.clone()).collect();
        let mut out = HashSet::new();
        {
            let table = lock(&self.table);
            for n in &chosen {
                if let Some(a) = table.address_of(n) {
                    if !a.is_empty() {
                        out.insert(a.to_owned());
                    }
                }
            }
        }
        let up = chosen.iter().filter(|n| linked.contains(*n)).count();
        let wanted = fanout::split(self.cfg.max_links).0.min(chosen.len()).max(1);
        if up < wanted {
            out.extend(self.cfg.peers.iter().cloned());
            out.extend(lock(&self.dns).iter().cloned());
        }
        let selves = lock(&self.self_addrs);
        out.retain(|a| !selves.contains(a));
        out
    }

    async fn dial_loop(self: Arc<Self>, addr: String) {
        let mut redial = Redial::new(self.cfg.heartbeat, self.cfg.expiry);
        loop {
            if self.stopped() || lock(&self.self_addrs).contains(&addr) {
                break;
            }
            if !self.desired_addresses().contains(&addr) {
                break;
            }
            let started = clock_now();
            if self.should_dial(&addr) {
                match self.clone().dial_once(&addr).await {
                    Ok(()) => {}
                    Err(DialError::IsSelf) => {
                        lock(&self.self_addrs).insert(addr.clone());
                        break;
                    }
                    Err(DialError::Other(e)) => {
                        tracing::debug!(%addr, error = %e, "dial failed");
                        self.note_unreachable(&addr, &e);
                    }
                }
                if clock_now().saturating_duration_since(started) >= self.cfg.expiry {
                    redial.reset();
                }
                tokio::time::sleep(redial.next_delay()).await;
            } else {
                tokio::time::sleep(self.cfg.heartbeat).await;
            }
        }
        lock(&self.dialing).remove(&addr);
        lock(&self.unreachable).remove(&addr);
    }

    /// The lower node id dials; the higher one only when nothing arrived from
    /// the lower for [`REDIAL_QUIET_HEARTBEATS`].
    fn should_dial(&self, addr: &str) -> bool {
        let node = {
            let table = lock(&self.table);
            table
                .addresses(clock_now())
                .into_iter()
                .find(|(_, a, _)| a == addr)
                .map(|(n, _, _)| n)
        };
        let Some(node) = node else { return true };
        if let Some(l) = self.link_with(&node) {
            // Already linked with that runtime: nothing to do.
            let quiet = clock_now().saturating_duration_since(l.last_rx);
            if quiet <= self.cfg.heartbeat * REDIAL_QUIET_HEARTBEATS {
                return false;
            }
        }
        node > self.id.node || self.link_with(&node).is_none()
    }

    async fn dial_once(self: Arc<Self>, addr: &str) -> Result<(), DialError> {
        let other = |e: &dyn std::fmt::Display| DialError::Other(e.to_string());
        let scheme = if self.cfg.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| other(&e))?
            .connect_timeout(self.cfg.heartbeat * 2)
            .local_address(self.cfg.bind_ip)
            .tcp_nodelay(true);
        if let Some(tls) = &self.cfg.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(|e| other(&e))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| DialError::Other(crate::error::error_chain(&e)))?;
        let mut client = pb::mesh_client::MeshClient::new(channel)
            .max_decoding_message_size(self.cfg.max_frame_bytes)
            .max_encoding_message_size(self.cfg.max_frame_bytes);
        let (tx, rx) = mpsc::channel::<pb::SyncFrame>(super::links::LINK_QUEUE);
        let hello = self.hello();
        let _ = tx.try_send(pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Hello(hello)),
        });
        let resp = tokio::time::timeout(self.cfg.expiry, client.sync(ReceiverStream::new(rx)))
            .await
            .map_err(|e| other(&e))?;
        let mut inbound = match resp {
            Ok(r) => r.into_inner(),
            Err(st) => {
                match dial_refusal(&st) {
                    DialRefusal::IsSelf => return Err(DialError::IsSelf),
                    // Unverified (it refused before sending its hello):
                    // shown and counted, but it changes nothing else.
                    DialRefusal::StoreMismatch {
                        node,
                        store_identity,
                    } if !node.is_empty() => {
                        self.refuse_store_mismatch(&node, addr, &store_identity, false);
                    }
                    DialRefusal::Credentials => {
                        tracing::warn!(%addr, error = %st.message(), "peer refused us");
                    }
                    _ => {}
                }
                return Err(other(&st));
            }
        };
        let Some(hello) = self.first_hello(&mut inbound).await else {
            return Err(DialError::Other("no hello from the peer".into()));
        };
        if let Err(r) = verify_hello(&hello, self.cfg.secret.as_deref()) {
            lock(&self.table).count_refusal(r);
            tracing::warn!(%addr, reason = r.as_str(), "refused the peer we dialed");
            return Err(DialError::Other(format!("peer refused: {}", r.as_str())));
        }
        if hello.node == self.id.node {
            return Err(DialError::IsSelf);
        }
        if self.other_store(&hello) {
            self.refuse_store_mismatch(&hello.node, addr, &hello.store_identity, true);
            return Err(DialError::Other("peer refused: store_mismatch".into()));
        }
        // One link per pair: the higher node drops its own dial when the
        // lower one's link is already up.
        if let Some(l) = self.link_with(&hello.node) {
            if !l.outbound && self.id.node > hello.node {
                return Ok(());
            }
        }
        lock(&self.unreachable).remove(addr);
        self.run_link(hello, addr.to_owned(), true, false, inbound, tx)
            .await;
        Ok(())
    }
}

#[derive(Debug)]
enum DialError {
    IsSelf,
    Other(String),
}
