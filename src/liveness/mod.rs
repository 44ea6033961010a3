//! Store-confirmed liveness: the rule that keeps a cut-off holder from
//! overlapping the runtime that takes its run over (SPEC §5, `docs/safety.md`).
//!
//! * [`fence`]: the pure self-fence — how long this sidecar may promise a
//!   hold, from the send time of its last confirmed refresh.
//! * [`observer`]: the pure observer — since when this sidecar has seen a
//!   suspect's counter unchanged, on its own monotonic clock.
//! * [`Guard`]: the I/O around both. It refreshes this instance's liveness
//!   record in the store every `expiry / 4`, reads the counters of the
//!   runtimes the mesh suspects, and builds the dead-holder sets: the mesh's
//!   view as is for renew and release (refusing is always safe), and for
//!   claims only what the store can confirm inside its atomic step.
//!
//! The mesh gives the view through [`MeshView`], so neither `mesh` nor
//! `store` depends on the server.

pub mod fence;
pub mod observer;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::claim::{DeadHolders, Holder};
use crate::store::DynStore;

pub use fence::{Bound, SelfFence};
pub use observer::Observer;

/// What the guard needs from the mesh.
pub trait MeshView: Send + Sync + 'static {
    /// The mesh's dead-holder set as is: expired, left and superseded
    /// instances, all unconditional.
    fn dead_holders(&self) -> DeadHolders;

    /// The holders dead for sure (left, or an older instance of a known
    /// node), and the instances that expired, whose death the store must
    /// confirm before a claim may take their runs over.
    fn dead_split(&self) -> (DeadHolders, Vec<Holder>);

    /// Runtimes whose liveness counter is worth watching: not alive, beat
    /// late, or their link just broke.
    fn suspects(&self) -> Vec<Holder>;
}

/// No mesh (tests, tools): nobody is dead, nobody suspect.
pub struct NoMesh;

impl MeshView for NoMesh {
    fn dead_holders(&self) -> DeadHolders {
        DeadHolders::none()
    }
    fn dead_split(&self) -> (DeadHolders, Vec<Holder>) {
        (DeadHolders::none(), Vec::new())
    }
    fn suspects(&self) -> Vec<Holder> {
        Vec::new()
    }
}

/// Timings of the guard.
#[derive(Debug, Clone, Copy)]
pub struct GuardConfig {
    pub heartbeat: Duration,
    pub expiry: Duration,
}

impl GuardConfig {
    /// How often this instance refreshes its record: a quarter expiry, so a
    /// hold answered at any moment is promised at least
    /// `expiry − margin − expiry/4` (about 0.65 expiry).
    pub fn refresh_every(&self) -> Duration {
        (self.expiry / 4).max(Duration::from_millis(10))
    }

    /// How often suspects' counters are read: a quarter heartbeat, so a
    /// killed holder is observed at most that long after its link breaks.
    pub fn observe_every(&self) -> Duration {
        (self.heartbeat / 4).max(Duration::from_millis(10))
    }
}

pub struct Guard {
    store: DynStore,
    holder: Holder,
    view: Arc<dyn MeshView>,
    cfg: GuardConfig,
    /// The store keeps leases *and* liveness records: early takeover is
    /// possible, so holds are bounded by the self-fence.
    records: bool,
    fence: Mutex<SelfFence>,
    /// Bumped whenever the bound may have moved (refresh, close).
    moved: watch::Sender<u64>,
    observer: Mutex<Observer>,
    /// Suspects whose death has been confirmed (so waiters are woken once).
    ripe: Mutex<HashSet<Holder>>,
    /// Bumped when a suspect's death is confirmed, to wake waiting claims.
    wake: watch::Sender<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Guard {
    pub fn new(
        store: DynStore,
        holder: Holder,
        view: Arc<dyn MeshView>,
        cfg: GuardConfig,
        wake: watch::Sender<u64>,
    ) -> Arc<Guard> {
        let records = store.leases().is_some_and(|l| l.keeps_liveness());
        let max_staleness = (cfg.heartbeat * 2).max(Duration::from_millis(100));
        Arc::new(Guard {
            store,
            holder,
            view,
            cfg,
            records,
            fence: Mutex::new(SelfFence::new(cfg.expiry)),
            moved: watch::channel(0).0,
            observer: Mutex::new(Observer::new(cfg.expiry, max_staleness)),
            ripe: Mutex::new(HashSet::new()),
            wake,
        })
    }

    /// Whether holds answered here are bounded by the self-fence.
    pub fn bounded(&self) -> bool {
        self.records
    }

    /// How often a `Hold` renews: every lease/3, and every expiry/3 when
    /// holds are bounded (each renewal then promises about 0.65 expiry).
    pub fn renew_every(&self, lease_ms: i64) -> Duration {
        let lease = Duration::from_millis((lease_ms / 3).max(1) as u64);
        if self.records {
            lease.min(self.cfg.expiry / 3)
        } else {
            lease
        }
    }

    /// What this sidecar may promise right now.
    pub fn bound(&self) -> Bound {
        if !self.records {
            return Bound::Unbounded;
        }
        lock(&self.fence).bound(Instant::now())
    }

    /// Changes whenever the bound may have moved.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.moved.subscribe()
    }

    /// Promise nothing from now on: the sidecar is leaving.
    pub fn close(&self) {
        lock(&self.fence).close();
        self.moved.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// One refresh of this instance's record; the bound moves on success.
    pub async fn refresh(&self) -> crate::Result<u64> {
        let sent = Instant::now();
        let timeout = self.cfg.refresh_every();
        let Some(leases) = self.store.leases() else {
            return Err(crate::Error::NoLeases(self.store.info().backend));
        };
        let counter = tokio::time::timeout(timeout, leases.beat(&self.holder))
            .await
            .map_err(|_| {
                crate::Error::Unavailable(format!("liveness refresh took longer than {timeout:?}"))
            })??;
        lock(&self.fence).refreshed(sent);
        self.moved.send_modify(|n| *n = n.wrapping_add(1));
        Ok(counter)
    }

    /// Reads the suspects' counters once.
    pub async fn observe(&self) -> crate::Result<usize> {
        let suspects: Vec<Holder> = self.view.suspects();
        {
            let keep: HashSet<Holder> = suspects.iter().cloned().collect();
            lock(&self.observer).retain(&keep);
        }
        if suspects.is_empty() {
            return Ok(0);
        }
        let timeout = self.cfg.observe_every().max(Duration::from_millis(200));
        let Some(leases) = self.store.leases() else {
            return Ok(0);
        };
        let counters = tokio::time::timeout(timeout, leases.beats_of(&suspects))
            .await
            .map_err(|_| crate::Error::Unavailable("liveness read timed out".into()))??;
        let at = Instant::now();
        let newly_ripe = {
            let mut o = lock(&self.observer);
            for (h, c) in suspects.iter().zip(counters) {
                o.saw(h, c, at);
            }
            let mut ripe = lock(&self.ripe);
            ripe.retain(|h| o.ripe(h, at).is_some());
            let mut newly = false;
            for h in suspects.iter().filter(|h| o.ripe(h, at).is_some()) {
                newly |= ripe.insert(h.clone());
            }
            newly
        };
        if newly_ripe {
            self.wake.send_modify(|n| *n = n.wrapping_add(1));
        }
        Ok(suspects.len())
    }

    /// Starts the refresh and observe loops; both end when `stop` flips.
    pub fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) {
        if !self.records {
            return;
        }
        let g = self.clone();
        let mut s = stop.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(g.cfg.refresh_every());
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = async { let _ = s.wait_for(|v| *v).await; } => return,
                }
                match g.refresh().await {
                    Ok(_) => {
                        if failing {
                            tracing::info!("liveness record refreshed again");
                        }
                        failing = false;
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!(error = %e, "cannot refresh this sidecar's liveness record; holds end at the self-fence");
                        }
                        failing = true;
                    }
                }
            }
        });
        let g = self.clone();
        let mut s = stop;
        tokio::spawn(async move {
            let mut every = tokio::time::interval(g.cfg.observe_every());
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = async { let _ = s.wait_for(|v| *v).await; } => return,
                }
                if let Err(e) = g.observe().await {
                    tracing::debug!(error = %e, "cannot read suspects' liveness records");
                }
            }
        });
    }

    /// For renew and release: the mesh's view as is.
    pub fn dead_holders(&self) -> DeadHolders {
        self.view.dead_holders()
    }

    /// For claims: left and superseded holders, and each expired holder
    /// whose counter this sidecar has seen unchanged for one expiry, on the
    /// condition that the store still has that counter.
    pub fn dead_for_claims(&self) -> DeadHolders {
        let (mut dead, expired) = self.view.dead_split();
        if self.records && !expired.is_empty() {
            let now = Instant::now();
            let o = lock(&self.observer);
            for h in expired {
                if let Some(c) = o.ripe(&h, now) {
                    dead.mark_dead_if(h, c);
                }
            }
        }
        dead
    }
}
