//! What the three Redis once strategies share: claims are immutable stream
//! entries `slot token node instance at` in the job's stream, results of
//! releases go to a hash next to it, there are no leases.

use std::collections::HashMap;

use ::redis::streams::{StreamId, StreamRangeReply};
use ::redis::{Script, Value};

use super::{fencing_of_id, load_script, reply, Conn, JobKeys, ScriptCall, Strategy};
use crate::claim::*;
use crate::error::{Error, FenceReason, Result};
use crate::store::StoreInfo;

const ONCE_LUA: &str = include_str!("once.lua");

/// How many entries a scan for a slot's entry looks at, at most.
pub(crate) const SCAN_LIMIT: u64 = 10_000;

/// A claim as stored in a job's stream.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub id: String,
    pub slot_ms: SlotMs,
    pub token: String,
    pub holder: Holder,
    pub at_ms: i64,
}

impl Entry {
    fn from_stream(e: &StreamId) -> Option<Entry> {
        let s = |k: &str| match e.map.get(k) {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Some(Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        };
        Some(Entry {
            id: e.id.clone(),
            slot_ms: s("slot")?.parse().ok()?,
            token: s("token")?,
            holder: Holder {
                node: s("node")?,
                instance: s("instance")?.parse().ok()?,
            },
            at_ms: s("at").and_then(|a| a.parse().ok()).unwrap_or(0),
        })
    }
}

pub(crate) struct OnceBase {
    pub conn: Conn,
    pub prefix: String,
    pub strategy: Strategy,
    pub info: StoreInfo,
    /// How long release results are kept (0 = as long as the claims: forever).
    pub results_ttl_ms: u64,
    release: Script,
}

impl OnceBase {
    pub(crate) async fn new(
        conn: Conn,
        prefix: &str,
        strategy: Strategy,
        info: StoreInfo,
        results_ttl_ms: u64,
    ) -> Result<OnceBase> {
        let release = load_script(&conn, ONCE_LUA).await?;
        Ok(OnceBase {
            conn,
            prefix: prefix.to_owned(),
            strategy,
            info,
            results_ttl_ms,
            release,
        })
    }

    /// The job's claims stream. The strategy is part of the name, so two
    /// strategies on one prefix never read each other's entries.
    pub(crate) fn stream_key(&self, job: &Job) -> String {
        JobKeys::new(&self.prefix, job).key(self.strategy.as_str())
    }

    /// The key a `WAIT` for replicas writes first (see [`Conn::invoke_acked`]).
    pub(crate) fn ack_key(&self, job: &Job) -> String {
        JobKeys::new(&self.prefix, job).key("ack")
    }

    fn results_key(&self, job: &Job) -> String {
        JobKeys::new(&self.prefix, job).key(&format!("{}:results", self.strategy.as_str()))
    }

    /// The entry with exactly this ID, if any.
    /// Read through [`Conn::acked`]: a resend that finds its own claim answers
    /// `WON` only once the claim is on `min_replicas` replicas.
    pub(crate) async fn entry(&self, key: &str, id: &str) -> Result<Option<Entry>> {
        let marker = format!("{key}:ack");
        let r: StreamRangeReply = self
            .conn
            .query_acked(::redis::cmd("XRANGE").arg(key).arg(id).arg(id), &marker)
            .await?;
        Ok(r.ids.first().and_then(Entry::from_stream))
    }

    /// The answer to a claim that found `entry` for its slot.
    pub(crate) fn answer(spec: &ClaimSpec, entry: &Entry, now_ms: i64) -> Result<ClaimAnswer> {
        let fencing = fencing_of_id(&entry.id)?;
        if entry.token == spec.token.as_str() {
            Ok(ClaimAnswer {
                outcome: Outcome::Won,
                token: Some(spec.token.clone()),
                attempt: 1,
                fencing,
                lease_until_ms: 0,
                now_ms,
                holder: Some(entry.holder.clone()),
                reason: None,
            })
        } else {
            Ok(ClaimAnswer {
                holder: Some(entry.holder.clone()),
                ..ClaimAnswer::bare(Outcome::Lost, now_ms, None)
            })
        }
    }

    /// Decodes the `{ status, id, token, node, instance, now }` reply of the
    /// `script` and `idmp` claim scripts.
    pub(crate) fn script_answer(
        &self,
        spec: &ClaimSpec,
        v: Value,
        window_field: &'static str,
    ) -> Result<ClaimAnswer> {
        let r = reply::array(v)?;
        let status = reply::string(r.first())?;
        let id = reply::string(r.get(1))?;
        let token = reply::string(r.get(2))?;
        let node = reply::string(r.get(3))?;
        let instance = reply::string(r.get(4))?;
        let now = reply::int(r.get(5))?;
        match status.as_str() {
            "found" | "added" => {
                let e = Entry {
                    id,
                    slot_ms: spec.slot_ms,
                    token,
                    holder: Holder {
                        node,
                        instance: instance.parse().unwrap_or_default(),
                    },
                    at_ms: now,
                };
                Self::answer(spec, &e, now)
            }
            "late" => Ok(ClaimAnswer::bare(Outcome::Late, now, Some("too_late"))),
            // The server remembers the slot, but its entry is gone: someone
            // claimed it; it is not ours to win.
            "gone" => Ok(ClaimAnswer::bare(Outcome::Lost, now, Some("unknown"))),
            "window" => Err(Error::invalid(
                window_field,
                format!(
                    "slot_ms + max_late_ms reaches past what the redis {} strategy remembers ({window_field}); the slot could be won twice",
                    self.strategy.as_str()
                ),
            )),
            other => Err(Error::Store(format!("redis: unexpected claim status {other:?}"))),
        }
    }

    /// Records the result next to the claim, if `spec.token` made it.
    /// `exact_id`: the entry's ID when the slot determines it (stream-id).
    pub(crate) async fn release(&self, spec: &ReleaseSpec, exact_id: Option<&str>) -> Result<()> {
        let mut inv = ScriptCall::new(&self.release, 2);
        inv.key(self.stream_key(&spec.job))
            .key(self.results_key(&spec.job))
            .arg(spec.slot_ms)
            .arg(spec.token.as_str())
            .arg(spec.result.state().as_str())
            .arg(exact_id.unwrap_or(""))
            .arg(self.results_ttl_ms)
            .arg(SCAN_LIMIT);
        let v: Value = self
            .conn
            .invoke_acked(&inv, || self.ack_key(&spec.job))
            .await?;
        let r = reply::array(v)?;
        if reply::int(r.first())? == 1 {
            return Ok(());
        }
        match reply::string(r.get(1))?.as_str() {
            "not_found" => Err(Error::NotFound("no such claim".into())),
            "not_holder" | "taken_over" => Err(Error::Fenced(FenceReason::NotHolder)),
            other => Err(Error::Store(format!("redis: unexpected answer {other:?}"))),
        }
    }

    /// Claims of `job` (newest slot first) with the results recorded for
    /// them. `entries` come from the strategy's stream read.
    pub(crate) async fn history_of(
        &self,
        job: &Job,
        mut entries: Vec<Entry>,
        limit: u32,
        before_slot_ms: Option<i64>,
        note: String,
    ) -> Result<HistoryPage> {
        if let Some(b) = before_slot_ms {
            entries.retain(|e| e.slot_ms < b);
        }
        // One run per slot: the oldest entry is the claim that counted.
        entries.sort_by(|a, b| {
            b.slot_ms
                .cmp(&a.slot_ms)
                .then_with(|| fencing_cmp(&a.id, &b.id))
        });
        entries.dedup_by_key(|e| e.slot_ms);
        entries.truncate(limit as usize);
        let results: HashMap<i64, (RunState, i64, String)> = if entries.is_empty() {
            HashMap::new()
        } else {
            let mut cmd = ::redis::cmd("HMGET");
            cmd.arg(self.results_key(job));
            for e in &entries {
                cmd.arg(e.slot_ms);
            }
            let vals: Vec<Option<String>> = self.conn.query(&cmd).await?;
            entries
                .iter()
                .zip(vals)
                .filter_map(|(e, v)| {
                    let v = v?;
                    let mut it = v.splitn(3, ' ');
                    let state = RunState::parse(it.next()?).ok()?;
                    let at: i64 = it.next()?.parse().ok()?;
                    let token = it.next()?.to_owned();
                    Some((e.slot_ms, (state, at, token)))
                })
                .collect()
        };
        let mut runs = Vec::with_capacity(entries.len());
        for e in entries {
            let (state, finished_at_ms) = match results.get(&e.slot_ms) {
                Some((s, at, tok)) if *tok == e.token => (*s, *at),
                _ => (RunState::Claimed, 0),
            };
            runs.push(RunRow {
                slot_ms: e.slot_ms,
                state,
                attempt: 1,
                fencing: fencing_of_id(&e.id)?,
                token: Token::parse(&e.token)
                    .map_err(|_| Error::Store("redis: malformed token in a claim".into()))?,
                holder: e.holder,
                lease_until_ms: 0,
                claimed_at_ms: e.at_ms,
                finished_at_ms,
            });
        }
        Ok(HistoryPage {
            runs,
            complete: false,
            note: Some(note),
        })
    }

    /// Runs the claim script of a bounded stream (`script`, `idmp`),
    /// acknowledged by `min_replicas`, and decodes its answer.
    pub(crate) async fn claim_by_script(
        &self,
        spec: &ClaimSpec,
        inv: &ScriptCall<'_>,
    ) -> Result<ClaimAnswer> {
        let v: Value = self
            .conn
            .invoke_acked(inv, || self.ack_key(&spec.job))
            .await?;
        self.script_answer(spec, v, "max_late_ms")
    }

    /// The history of a bounded stream (`script`, `idmp`): its recent
    /// entries with their results.
    pub(crate) async fn recent_history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
        note: String,
    ) -> Result<HistoryPage> {
        let entries = self.recent_entries(job).await?;
        self.history_of(job, entries, limit, before_slot_ms, note)
            .await
    }

    /// Every entry of a bounded stream (script, idmp), newest first, at most
    /// [`SCAN_LIMIT`].
    pub(crate) async fn recent_entries(&self, job: &Job) -> Result<Vec<Entry>> {
        let r: StreamRangeReply = self
            .conn
            .query(
                ::redis::cmd("XREVRANGE")
                    .arg(self.stream_key(job))
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(SCAN_LIMIT),
            )
            .await?;
        Ok(r.ids.iter().filter_map(Entry::from_stream).collect())
    }

    pub(crate) fn parse_entries(r: &StreamRangeReply) -> Vec<Entry> {
        r.ids.iter().filter_map(Entry::from_stream).collect()
    }
}

fn fencing_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    match (fencing_of_id(a), fencing_of_id(b)) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.cmp(b),
    }
}

/// The `Store` impl of a once strategy: `claim`, `release` and `history`
/// come from the strategy's `do_claim`, `do_release` and `do_history`;
/// there are no leases, and nothing to prune (each strategy bounds its own
/// streams, or keeps them forever).
///
/// `once_store!(T, bounded)`: a strategy over a bounded stream (`script`,
/// `idmp`), whose release finds the claim by a scan and whose history is the
/// stream's recent entries, noted with `T::history_note`.
macro_rules! once_store {
    ($t:ty, bounded) => {
        impl $t {
            async fn do_release(
                &self,
                spec: &crate::claim::ReleaseSpec,
            ) -> crate::error::Result<()> {
                self.base.release(spec, None).await
            }

            async fn do_history(
                &self,
                job: &crate::claim::Job,
                limit: u32,
                before_slot_ms: Option<i64>,
            ) -> crate::error::Result<crate::claim::HistoryPage> {
                self.base
                    .recent_history(job, limit, before_slot_ms, self.history_note())
                    .await
            }
        }

        once_store!($t);
    };
    ($t:ty) => {
        #[async_trait::async_trait]
        impl crate::store::Store for $t {
            fn info(&self) -> &crate::store::StoreInfo {
                &self.base.info
            }

            async fn claim(
                &self,
                spec: &crate::claim::ClaimSpec,
                _dead: &crate::claim::DeadHolders,
            ) -> crate::error::Result<crate::claim::ClaimAnswer> {
                self.do_claim(spec).await
            }

            async fn release(
                &self,
                spec: &crate::claim::ReleaseSpec,
                _dead: &crate::claim::DeadHolders,
            ) -> crate::error::Result<()> {
                self.do_release(spec).await
            }

            async fn history(
                &self,
                job: &crate::claim::Job,
                limit: u32,
                before_slot_ms: Option<i64>,
            ) -> crate::error::Result<crate::claim::HistoryPage> {
                self.do_history(job, limit, before_slot_ms).await
            }

            async fn ping(&self) -> crate::error::Result<()> {
                self.base
                    .conn
                    .query::<String>(&::redis::cmd("PING"))
                    .await
                    .map(|_| ())
            }

            async fn now_ms(&self) -> crate::error::Result<i64> {
                crate::store::redis::time_ms(&self.base.conn).await
            }
        }
    };
}
pub(crate) use once_store;
