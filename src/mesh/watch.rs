//! `WatchPeers`: a snapshot of the runtimes, then their changes, for one
//! watcher; a watcher that falls behind gets RESOURCE_EXHAUSTED.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::node::{clock_now, lock, Mesh};
use crate::error::MeshError;
use crate::proto as pb;

impl Mesh {
    /// A `WatchPeers` stream: a SNAPSHOT per runtime, then changes. A watcher
    /// that falls `watch_buffer` events behind gets RESOURCE_EXHAUSTED.
    pub fn watch(
        &self,
        include_expired: bool,
    ) -> impl tokio_stream::Stream<Item = Result<pb::PeerEvent, Status>> + Send + 'static {
        self.watch_inner(include_expired, true).1
    }

    /// The same stream as [`Mesh::watch`], with the snapshot handed over as
    /// one list instead of SNAPSHOT events (the dashboard sends it whole).
    pub fn watch_with_snapshot(
        &self,
        include_expired: bool,
    ) -> (
        Vec<pb::Peer>,
        impl tokio_stream::Stream<Item = Result<pb::PeerEvent, Status>> + Send + 'static,
    ) {
        self.watch_inner(include_expired, false)
    }

    fn watch_inner(
        &self,
        include_expired: bool,
        snapshot_events: bool,
    ) -> (
        Vec<pb::Peer>,
        impl tokio_stream::Stream<Item = Result<pb::PeerEvent, Status>> + Send + 'static,
    ) {
        let mut rx = self.events.subscribe();
        let overflow = Arc::new(Mutex::new(None::<Status>));
        let now = clock_now();
        // WatchPeers' snapshot starts with this runtime itself, so a lone
        // sidecar's watcher sees something at once.
        let own = snapshot_events.then(|| self.self_peer(now));
        let snapshot: Vec<pb::Peer> = own
            .into_iter()
            .chain(lock(&self.table).peers(now))
            .filter(|p| {
                include_expired
                    || matches!(
                        pb::PeerState::try_from(p.state),
                        Ok(pb::PeerState::Alive | pb::PeerState::Unreachable)
                    )
            })
            .collect();
        // The snapshot does not count against watch_buffer: the channel holds
        // all of it plus watch_buffer events.
        let (tx, out) =
            mpsc::channel::<pb::PeerEvent>(self.cfg.watch_buffer.max(1) + snapshot.len());
        let (snapshot, handed_over) = if snapshot_events {
            (snapshot, Vec::new())
        } else {
            (Vec::new(), snapshot)
        };
        let fail = overflow.clone();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            let send = |ev: pb::PeerEvent| -> bool {
                match tx.try_send(ev) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        *lock(&fail) = Some(MeshError::WatcherBehind.into());
                        false
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            };
            for p in snapshot {
                let ev = pb::PeerEvent {
                    kind: pb::PeerEventKind::Snapshot as i32,
                    peer: Some(p),
                };
                if !send(ev) {
                    return;
                }
            }
            loop {
                let ev = tokio::select! {
                    ev = rx.recv() => ev,
                    _ = stop.changed() => return,
                };
                match ev {
                    Ok(ev) => {
                        if !send(ev) {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        *lock(&fail) = Some(MeshError::WatcherBehind.into());
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        let stream = ReceiverStream::new(out)
            .map(Ok)
            .chain(futures::stream::unfold(overflow, |slot| async move {
                let err = lock(&slot).take();
                err.map(|e| (Err(e), slot))
            }));
        (handed_over, stream)
    }
}
