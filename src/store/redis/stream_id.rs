//! Redis `stream-id`: the slot is the stream entry ID.
//!
//! Why the step is atomic: a claim is one command, `XADD <stream>
//! <slot_ms>-0 slot … token …`. A stream only accepts an ID greater than its
//! top item, so of all the claims of a slot exactly one is appended; every
//! other one is refused with "equal or smaller than the target stream top
//! item". The refused caller reads that exact ID (`XRANGE id id`): its own
//! token → `WON` (a resend of its own claim), another token → `LOST`, no
//! entry → `LATE` with reason `slot_older_than_newest` (a newer slot was
//! already claimed, so this older one can never be appended).
//!
//! So this strategy expects the slots of a job to be claimed in increasing
//! order, as a cron schedule does. Slot 0 is stored as ID `0-1` (`0-0` is
//! not a valid ID). Claims are kept forever: nothing trims the stream (an
//! operator may `XTRIM MINID`; trimmed slots then answer `LATE`, never `WON`,
//! because the stream keeps its top ID).
//!
//! `now` (for `LATE`) is Redis's clock, estimated from `TIME` (see
//! [`RedisClock`]), because the step is a plain command with no script to
//! call `TIME` in.

use ::redis::Value;

use super::once::{once_store, Entry, OnceBase};
use super::{convert, fencing_of_id, Conn, RedisClock, RedisConfig, Strategy};
use crate::claim::*;
use crate::error::Result;
use crate::store::StoreInfo;

pub struct StreamIdStore {
    base: OnceBase,
    clock: RedisClock,
}

/// The entry ID of a slot.
fn entry_id(slot: SlotMs) -> String {
    if slot == 0 {
        "0-1".to_owned()
    } else {
        format!("{slot}-0")
    }
}

fn id_too_small(e: &::redis::RedisError) -> bool {
    e.to_string().contains("equal or smaller")
}

impl StreamIdStore {
    pub(crate) async fn open(conn: Conn, cfg: &RedisConfig) -> Result<Self> {
        let clock = RedisClock::new(&conn).await?;
        let info = StoreInfo {
            backend: cfg.backend_name(),
            leases: false,
            full_history: false,
            retention:
                "claims are kept forever (stream-id); slots are expected in increasing order".into(),
            identity: cfg.identity(),
        };
        Ok(StreamIdStore {
            base: OnceBase::new(conn, &cfg.prefix, Strategy::StreamId, info, 0).await?,
            clock,
        })
    }

    async fn existing(
        &self,
        spec: &ClaimSpec,
        key: &str,
        id: &str,
        now: i64,
    ) -> Result<Option<ClaimAnswer>> {
        match self.base.entry(key, id).await? {
            Some(e) => Ok(Some(OnceBase::answer(spec, &e, now)?)),
            None => Ok(None),
        }
    }
}

once_store!(StreamIdStore);

impl StreamIdStore {
    async fn do_claim(&self, spec: &ClaimSpec) -> Result<ClaimAnswer> {
        let key = self.base.stream_key(&spec.job);
        let id = entry_id(spec.slot_ms);
        let now = self.clock.now(&self.base.conn).await?;
        if spec.slot_ms != 0 && now.saturating_sub(spec.slot_ms) > spec.max_late_ms {
            // Too late to start it; a claim already stored is still answered.
            return Ok(match self.existing(spec, &key, &id, now).await? {
                Some(a) => a,
                None => ClaimAnswer::bare(Outcome::Late, now, Some("too_late")),
            });
        }
        let mut xadd = ::redis::cmd("XADD");
        xadd.arg(&key)
            .arg(&id)
            .arg("slot")
            .arg(spec.slot_ms)
            .arg("token")
            .arg(spec.token.as_str())
            .arg("node")
            .arg(&spec.holder.node)
            .arg("instance")
            .arg(spec.holder.instance)
            .arg("at")
            .arg(now);
        let mut acked = self.base.conn.acked(&format!("{key}:ack"));
        let res: ::redis::RedisResult<Value> = xadd.query_async(&mut acked).await;
        if let Err(e) = acked.shortfall() {
            if res.is_ok() {
                return Err(e);
            }
        }
        match res {
            Ok(v) => {
                let stored = super::reply::string(Some(&v))?;
                Ok(ClaimAnswer {
                    outcome: Outcome::Won,
                    token: Some(spec.token.clone()),
                    attempt: 1,
                    fencing: fencing_of_id(&stored)?,
                    lease_until_ms: 0,
                    now_ms: now,
                    holder: Some(spec.holder.clone()),
                    reason: None,
                })
            }
            Err(e) if id_too_small(&e) => Ok(match self.existing(spec, &key, &id, now).await? {
                Some(a) => a,
                None => ClaimAnswer::bare(Outcome::Late, now, Some("slot_older_than_newest")),
            }),
            Err(e) => Err(convert(e)),
        }
    }

    async fn do_release(&self, spec: &ReleaseSpec) -> Result<()> {
        self.base.release(spec, Some(&entry_id(spec.slot_ms))).await
    }

    async fn do_history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage> {
        let end = match before_slot_ms {
            Some(b) if b <= 0 => {
                return self
                    .base
                    .history_of(job, Vec::new(), limit, None, note())
                    .await
            }
            Some(b) => format!("({b}-0"),
            None => "+".to_owned(),
        };
        let r: ::redis::streams::StreamRangeReply = self
            .base
            .conn
            .query(
                ::redis::cmd("XREVRANGE")
                    .arg(self.base.stream_key(job))
                    .arg(end)
                    .arg("-")
                    .arg("COUNT")
                    .arg(limit),
            )
            .await?;
        let entries: Vec<Entry> = OnceBase::parse_entries(&r);
        self.base
            .history_of(job, entries, limit, before_slot_ms, note())
            .await
    }
}

fn note() -> String {
    "redis stream-id keeps who claimed each slot, forever, and the result when the holder released it; no leases, attempts or takeovers".into()
}
