//! Redis `lease`: runs with leases, decided by one Lua script.
//!
//! Why the step is atomic: Redis runs a script to completion before it runs
//! any other command, so the read of the run, the decision (the §3.1 table,
//! with `now` from `TIME` and the caller's dead-holder set as arguments) and
//! the writes happen with nothing in between, on every node of the fleet.
//! The script is called with `EVALSHA` ([`ScriptCall`]), which loads it
//! and retries when the server answers `NOSCRIPT` (after a restart, a
//! failover or `SCRIPT FLUSH`).
//!
//! Keys of a job (`{job}` is a cluster hash tag, so they share one slot):
//! `<prefix>:{<job>}:runs` (hash slot → run), `:slots` (zset, for history and
//! pruning), `:running` (set, for `overlap = SKIP`), `:fence` (the job's
//! fencing counter) and `:history` (stream, `MAXLEN ~ history_maxlen`).
//!
//! Outside the job's slot: `<prefix>:holder:<node>:<instance>` (set of
//! `job\0slot` a holder won, for ending its leases when it leaves) and
//! `<prefix>:jobs` (the jobs with runs, walked by `prune`). On one server the
//! script updates both inside the step; on a cluster they are in other slots,
//! so they are updated by separate commands right after it. They are
//! helpers, never part of a decision: a missed update only means a lease
//! ends by its clock instead of at a graceful leave, or a job is pruned
//! later.

use std::collections::HashSet;
use std::sync::Mutex;

use ::redis::{Script, Value};
use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};

use super::{
    concat, convert, holder_key, load_script, reply, Conn, JobKeys, RedisConfig, ScriptCall,
};
use crate::claim::*;
use crate::error::{Error, FenceReason, Result};
use crate::store::{Leases, Store, StoreInfo, StoreOptions};

const LEASE_LUA: &str = include_str!("lease.lua");

/// Jobs visited by one `prune` call, at most.
const PRUNE_JOBS_PER_CALL: usize = 1000;
/// Cluster only: how many job names this process remembers having
/// registered, before it forgets them all and registers again.
const REGISTERED_CACHE: usize = 100_000;

pub struct LeaseStore {
    conn: Conn,
    script: Script,
    prefix: String,
    history_maxlen: u64,
    /// TTL of a holder's index set (refreshed at every win).
    holder_ttl_ms: u64,
    info: StoreInfo,
    /// Where the next `prune` continues in the job registry.
    prune_cursor: tokio::sync::Mutex<u64>,
    /// Cluster only: jobs this process has put in the registry.
    registered: Mutex<HashSet<Job>>,
    /// One server only: the id of the memory record last seen (see
    /// "Restarts" in docs/stores/redis.md), empty before the first.
    memory_record_id: Mutex<String>,
    quarantine_ms: u64,
    /// A cluster or a Sentinel group (replicas, failovers): fencing numbers
    /// never fall below a thousand per millisecond of the store's clock.
    time_fence: bool,
    /// `<prefix>:jobs`, `<prefix>:memory` (the memory record, one server
    /// only) and `<prefix>:liveness`, built once.
    registry: String,
    memory: String,
    liveness: String,
}

impl LeaseStore {
    pub(crate) async fn open(conn: Conn, cfg: &RedisConfig, opts: &StoreOptions) -> Result<Self> {
        let script = load_script(&conn, LEASE_LUA).await?;
        let memory = concat(&[&cfg.prefix, ":memory"]);
        // The record this server holds now, if any: from here on its loss
        // means the server forgot.
        let memory_record_id = if conn.is_cluster() {
            String::new()
        } else {
            let v: Option<String> = conn.query(::redis::cmd("GET").arg(&memory)).await?;
            v.and_then(|v| v.split(' ').next().map(str::to_owned))
                .unwrap_or_default()
        };
        Ok(LeaseStore {
            conn,
            script,
            prefix: cfg.prefix.clone(),
            history_maxlen: cfg.history_maxlen,
            holder_ttl_ms: opts.retention.as_millis().max(1) as u64,
            info: StoreInfo {
                backend: cfg.backend_name(),
                leases: true,
                full_history: true,
                retention: format!(
                    "runs are kept {} after their slot and their claim, whichever is later (longer than any late claim may ask); each job's event stream holds about its last {} events",
                    crate::duration::human(opts.retention),
                    cfg.history_maxlen
                ),
                identity: cfg.identity(),
            },
            prune_cursor: tokio::sync::Mutex::new(0),
            registered: Mutex::new(HashSet::new()),
            memory_record_id: Mutex::new(memory_record_id),
            quarantine_ms: cfg.quarantine_ms,
            time_fence: cfg.cluster || cfg.sentinel.is_some(),
            registry: concat(&[&cfg.prefix, ":jobs"]),
            memory,
            liveness: concat(&[&cfg.prefix, ":liveness"]),
        })
    }

    /// A call with the job's five keys, then `extra` keys (outside the
    /// job's slot: one server only), then `op`, the first argument.
    fn invocation(&self, job: &Job, op: &str, extra: &[&str]) -> ScriptCall<'_> {
        let k = JobKeys::new(&self.prefix, job);
        let mut inv = ScriptCall::new(&self.script, 5 + extra.len());
        inv.key(k.key("runs"))
            .key(k.key("slots"))
            .key(k.key("running"))
            .key(k.key("fence"))
            .key(k.key("history"));
        for key in extra {
            inv.key(*key);
        }
        inv.arg(op);
        inv
    }

    async fn run(&self, inv: &ScriptCall<'_>) -> Result<Vec<Value>> {
        let v: Value = self.conn.invoke(inv).await?;
        reply::array(v)
    }

    /// [`run`](Self::run), then `WAIT` for `min_replicas` on the same
    /// connection (claim, renew, release): see [`Conn::invoke_acked`].
    async fn run_acked(&self, inv: &ScriptCall<'_>, job: &Job) -> Result<Vec<Value>> {
        reply::array(self.invoke_acked(inv, job).await?)
    }

    /// The script's reply as it came, `WAIT`ed for like [`run_acked`](Self::run_acked).
    async fn invoke_acked(&self, inv: &ScriptCall<'_>, job: &Job) -> Result<Value> {
        self.conn
            .invoke_acked(inv, || JobKeys::new(&self.prefix, job).key("ack"))
            .await
    }

    /// Cluster only: the index updates the script cannot do across slots.
    async fn after_win(&self, spec: &ClaimSpec, created: bool) -> Result<()> {
        let key = holder_key(&self.prefix, &spec.holder);
        let mut pipe = ::redis::pipe();
        pipe.cmd("SADD")
            .arg(&key)
            .arg(member(&spec.job, spec.slot_ms))
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(self.holder_ttl_ms)
            .ignore();
        pipe.query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(convert)?;
        let fresh = {
            let mut reg = self.registered.lock().unwrap_or_else(|p| p.into_inner());
            if reg.len() >= REGISTERED_CACHE {
                reg.clear();
            }
            reg.insert(spec.job.clone())
        };
        if created || fresh {
            self.conn
                .query::<()>(
                    ::redis::cmd("SADD")
                        .arg(self.registry.as_str())
                        .arg(spec.job.as_str()),
                )
                .await?;
        }
        Ok(())
    }

    async fn unindex(&self, job: &Job, slot: SlotMs, node: &str, instance: &str) {
        let Ok(instance) = instance.parse::<u64>() else {
            return;
        };
        let h = Holder {
            node: node.to_owned(),
            instance,
        };
        let res = self
            .conn
            .query::<()>(
                ::redis::cmd("SREM")
                    .arg(holder_key(&self.prefix, &h))
                    .arg(member(job, slot)),
            )
            .await;
        if let Err(e) = res {
            tracing::debug!(error = %e, "could not update the holder index");
        }
    }
}

/// A holder-index member: `job\0slot`.
fn member(job: &Job, slot: SlotMs) -> String {
    concat(&[job.as_str(), "\0", itoa::Buffer::new().format(slot)])
}

/// A field of the liveness hash: `node\0instance`.
fn liveness_field(h: &Holder) -> String {
    format!("{}\0{}", h.node, h.instance)
}

/// The dead-holder set as script arguments: count + pairs, count + pairs,
/// count + triples. With `check`, the conditional entries go as triples for
/// the script to check against the liveness hash (a claim); without, they
/// count as dead outright (renew and release, where refusing is safe).
fn dead_args(inv: &mut ScriptCall<'_>, dead: &DeadHolders, check: bool) {
    let mut explicit: Vec<&Holder> = dead.dead().collect();
    if !check {
        explicit.extend(dead.conditional().map(|(h, _)| h));
    }
    inv.arg(explicit.len());
    for h in explicit {
        inv.arg(&h.node).arg(h.instance);
    }
    let current: Vec<(&String, &u64)> = dead.current().collect();
    inv.arg(current.len());
    for (node, instance) in current {
        inv.arg(node).arg(*instance);
    }
    if check {
        let conditional: Vec<(&Holder, u64)> = dead.conditional().collect();
        inv.arg(conditional.len());
        for (h, counter) in conditional {
            inv.arg(&h.node).arg(h.instance).arg(counter);
        }
    } else {
        inv.arg(0);
    }
}

fn fence_error(reason: &str) -> Error {
    match reason {
        "not_found" => Error::NotFound("no such run".into()),
        "taken_over" => Error::Fenced(FenceReason::TakenOver),
        "not_holder" => Error::Fenced(FenceReason::NotHolder),
        "released" => Error::Fenced(FenceReason::Released),
        "finished" => Error::Fenced(FenceReason::Finished),
        "holder_dead" => Error::Fenced(FenceReason::HolderDead),
        other => Error::Store(format!("redis: unexpected answer {other:?}")),
    }
}

/// The claim's reply: one string (`lease.lua`, `op == 'claim'`), which the
/// connection reads as one bulk value instead of an array of ten.
#[derive(Debug, PartialEq)]
struct ClaimReply {
    code: i64,
    attempt: u32,
    fencing: u64,
    lease_until_ms: i64,
    now_ms: i64,
    instance: u64,
    reason: Option<&'static str>,
    created: bool,
    memory_id: String,
    node: String,
}

impl ClaimReply {
    /// `code attempt fencing lease_until now instance reason created
    /// memory_id node`, single spaces, the node last (it may hold spaces).
    fn parse(v: Value) -> Result<ClaimReply> {
        let b = match v {
            Value::BulkString(b) => b,
            other => {
                return Err(Error::Store(format!(
                    "redis: the claim script answered {other:?}, not its reply string"
                )))
            }
        };
        let s = std::str::from_utf8(&b)
            .map_err(|_| Error::Store("redis: the claim reply is not UTF-8".into()))?;
        let bad =
            |field: &str| Error::Store(format!("redis: malformed claim reply ({field}): {s:?}"));
        let mut f = s.splitn(10, ' ');
        let mut next = |field: &'static str| f.next().ok_or_else(|| bad(field));
        let int = |v: &str, field: &str| v.parse::<i64>().map_err(|_| bad(field));
        let code = int(next("code")?, "code")?;
        let attempt = int(next("attempt")?, "attempt")? as u32;
        let fencing = int(next("fencing")?, "fencing")? as u64;
        let lease_until_ms = int(next("lease_until")?, "lease_until")?;
        let now_ms = int(next("now")?, "now")?;
        let instance = next("instance")?.parse().unwrap_or_default();
        let reason = static_reason(next("reason")?);
        let created = next("created")? == "1";
        let memory_id = next("memory_id")?.to_string();
        let node = next("node")?.to_string();
        Ok(ClaimReply {
            code,
            attempt,
            fencing,
            lease_until_ms,
            now_ms,
            instance,
            reason,
            created,
            memory_id,
            node,
        })
    }
}

fn static_reason(r: &str) -> Option<&'static str> {
    Some(match r {
        "too_late" => "too_late",
        "job_running" => "job_running",
        "interrupted" => "interrupted",
        "succeeded" => "succeeded",
        "failed" => "failed",
        "finished" => "finished",
        "store_restarted" => "store_restarted",
        _ => return None,
    })
}

/// Decodes a run record (the format is documented in `lease.lua`).
fn decode_run(slot: &str, v: &str) -> Result<RunRow> {
    let bad = || Error::Store(format!("redis: malformed run record for slot {slot}"));
    let mut it = v.splitn(9, ' ');
    let mut next = || it.next().ok_or_else(bad);
    let state = RunState::parse(next()?)?;
    let int = |s: &str| s.parse::<i64>().map_err(|_| bad());
    let attempt = int(next()?)? as u32;
    let fencing = int(next()?)? as u64;
    let lease_until_ms = int(next()?)?;
    let claimed_at_ms = int(next()?)?;
    let finished_at_ms = int(next()?)?;
    let token = Token::parse(next()?).map_err(|_| bad())?;
    let instance = int(next()?)? as u64;
    let node = next()?.to_owned();
    Ok(RunRow {
        slot_ms: int(slot)?,
        state,
        attempt,
        fencing,
        token,
        holder: Holder { node, instance },
        lease_until_ms,
        claimed_at_ms,
        finished_at_ms,
    })
}

#[async_trait]
impl Store for LeaseStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    async fn claim(&self, spec: &ClaimSpec, dead: &DeadHolders) -> Result<ClaimAnswer> {
        let single = !self.conn.is_cluster();
        let holder = holder_key(&self.prefix, &spec.holder);
        let extra = [
            self.registry.as_str(),
            &holder,
            &self.memory,
            &self.liveness,
        ];
        let mut inv = self.invocation(&spec.job, "claim", if single { &extra } else { &[] });
        let expected = self
            .memory_record_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        inv.arg(spec.slot_ms)
            .arg(spec.token.as_str())
            .arg(&spec.holder.node)
            .arg(spec.holder.instance)
            .arg(spec.lease_ms)
            .arg(spec.max_late_ms)
            .arg(u8::from(spec.overlap == Overlap::Skip))
            .arg(spec.max_attempts)
            .arg(self.history_maxlen)
            .arg(member(&spec.job, spec.slot_ms))
            .arg(self.holder_ttl_ms)
            .arg(spec.job.as_str())
            .arg(&expected)
            .arg(self.quarantine_ms)
            .arg(u8::from(self.time_fence));
        dead_args(&mut inv, dead, single);
        let r = ClaimReply::parse(self.invoke_acked(&inv, &spec.job).await?)?;
        if single {
            let seen = r.memory_id;
            if seen != expected {
                if !expected.is_empty() {
                    tracing::warn!(
                        prefix = %self.prefix,
                        "redis forgot its claims (a restart without persistence, FLUSHALL or eviction)"
                    );
                }
                *self
                    .memory_record_id
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = seen;
            }
        }
        let holder = (!r.node.is_empty()).then_some(Holder {
            node: r.node,
            instance: r.instance,
        });
        let outcome = match r.code {
            1 => Outcome::Won,
            2 => Outcome::Running,
            3 => Outcome::Done,
            4 => Outcome::Late,
            5 => Outcome::Overlap,
            6 => {
                return Err(Error::Unavailable(format!(
                    "redis forgot its claims (a restart without persistence?); no claim is decided for {} ms more",
                    (r.lease_until_ms - r.now_ms).max(0)
                )))
            }
            other => return Err(Error::Store(format!("redis: unknown claim code {other}"))),
        };
        if outcome == Outcome::Won && !single {
            // The run is ours whatever happens to the helper indexes: a
            // missed update only costs the graceful end of this lease.
            if let Err(e) = self.after_win(spec, r.created).await {
                tracing::warn!(error = %e, job = %spec.job, "could not index a won run");
            }
        }
        Ok(ClaimAnswer {
            outcome,
            token: (outcome == Outcome::Won).then(|| spec.token.clone()),
            attempt: r.attempt,
            fencing: r.fencing,
            lease_until_ms: r.lease_until_ms,
            now_ms: r.now_ms,
            holder,
            reason: r.reason,
        })
    }

    async fn release(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Result<()> {
        let mut inv = self.invocation(&spec.job, "release", &[]);
        inv.arg(spec.slot_ms)
            .arg(spec.token.as_str())
            .arg(spec.result.state().as_str())
            .arg(self.history_maxlen);
        dead_args(&mut inv, dead, false);
        let r = self.run_acked(&inv, &spec.job).await?;
        if reply::int(r.first())? != 1 {
            return Err(fence_error(&reply::string(r.get(1))?));
        }
        let node = reply::string(r.get(1))?;
        let instance = reply::string(r.get(2))?;
        self.unindex(&spec.job, spec.slot_ms, &node, &instance)
            .await;
        Ok(())
    }

    async fn history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage> {
        let mut inv = self.invocation(job, "history", &[]);
        inv.arg(match before_slot_ms {
            Some(b) => format!("({b}"),
            None => "+inf".to_owned(),
        })
        .arg(limit);
        let r = self.run(&inv).await?;
        let mut runs = Vec::with_capacity(r.len() / 2);
        for pair in r.chunks(2) {
            let slot = reply::string(pair.first())?;
            let rec = reply::string(pair.get(1))?;
            runs.push(decode_run(&slot, &rec)?);
        }
        Ok(HistoryPage {
            runs,
            complete: true,
            note: None,
        })
    }

    async fn ping(&self) -> Result<()> {
        self.conn
            .query::<String>(&::redis::cmd("PING"))
            .await
            .map(|_| ())
    }

    async fn now_ms(&self) -> Result<i64> {
        super::time_ms(&self.conn).await
    }

    fn leases(&self) -> Option<&dyn Leases> {
        Some(self)
    }
}

#[async_trait]
impl Leases for LeaseStore {
    async fn renew(&self, spec: &RenewSpec, dead: &DeadHolders) -> Result<Renewed> {
        let mut inv = self.invocation(&spec.job, "renew", &[]);
        inv.arg(spec.slot_ms)
            .arg(spec.token.as_str())
            .arg(spec.lease_ms);
        dead_args(&mut inv, dead, false);
        let r = self.run_acked(&inv, &spec.job).await?;
        if reply::int(r.first())? != 1 {
            return Err(fence_error(&reply::string(r.get(1))?));
        }
        Ok(Renewed {
            lease_until_ms: reply::int(r.get(1))?,
            attempt: reply::int(r.get(2))? as u32,
            fencing: reply::int(r.get(3))? as u64,
            now_ms: reply::int(r.get(4))?,
        })
    }

    async fn end_lease(&self, job: &Job, slot_ms: SlotMs, token: &Token) -> Result<bool> {
        let mut inv = self.invocation(job, "end", &[]);
        inv.arg(slot_ms)
            .arg(token.as_str())
            .arg(self.history_maxlen);
        let r = self.run(&inv).await?;
        if reply::int(r.first())? != 1 {
            return Ok(false);
        }
        let node = reply::string(r.get(1))?;
        let instance = reply::string(r.get(2))?;
        self.unindex(job, slot_ms, &node, &instance).await;
        Ok(true)
    }

    async fn end_leases_of(&self, holder: &Holder) -> Result<u64> {
        let key = holder_key(&self.prefix, holder);
        let members: Vec<Vec<u8>> = self.conn.query(::redis::cmd("SMEMBERS").arg(&key)).await?;
        let targets: Vec<(Job, SlotMs)> = members
            .iter()
            .filter_map(|m| {
                let s = std::str::from_utf8(m).ok()?;
                let (job, slot) = s.split_once('\0')?;
                Some((Job::parse(job).ok()?, slot.parse().ok()?))
            })
            .collect();
        // Concurrent scripts are pipelined on the multiplexed connection.
        let ended: Vec<bool> = futures::stream::iter(targets)
            .map(|(job, slot)| async move {
                let mut inv = self.invocation(&job, "end_holder", &[]);
                inv.arg(slot)
                    .arg(&holder.node)
                    .arg(holder.instance)
                    .arg(self.history_maxlen);
                let r = self.run(&inv).await?;
                Ok::<bool, Error>(reply::int(r.first())? == 1)
            })
            .buffer_unordered(32)
            .try_collect()
            .await?;
        self.conn.query::<()>(::redis::cmd("DEL").arg(&key)).await?;
        Ok(ended.into_iter().filter(|&e| e).count() as u64)
    }

    async fn prune(&self, cutoff_ms: i64, batch: u32) -> Result<u64> {
        let mut cursor = self.prune_cursor.lock().await;
        let registry = self.registry.as_str();
        let single = !self.conn.is_cluster();
        let mut removed: u64 = 0;
        let mut visited = 0usize;
        loop {
            let (next, jobs): (u64, Vec<String>) = self
                .conn
                .query(
                    ::redis::cmd("SSCAN")
                        .arg(registry)
                        .arg(*cursor)
                        .arg("COUNT")
                        .arg(100),
                )
                .await?;
            for name in jobs {
                let Ok(job) = Job::parse(&name) else {
                    continue;
                };
                visited += 1;
                let extra = [registry];
                let mut inv = self.invocation(&job, "prune", if single { &extra } else { &[] });
                let limit = (batch as u64).saturating_sub(removed).max(1);
                inv.arg(cutoff_ms)
                    .arg(limit)
                    .arg(limit.saturating_mul(4).max(100))
                    .arg(job.as_str());
                let r = self.run(&inv).await?;
                removed += reply::int(r.first())?.max(0) as u64;
                let left = reply::int(r.get(1))?;
                if left == 0 && !single {
                    // Unregister, then look again: a claim that created the
                    // job meanwhile registers it after its step, so either it
                    // sees our SREM done or we see its run.
                    let runs = JobKeys::new(&self.prefix, &job).key("runs");
                    self.conn
                        .query::<()>(::redis::cmd("SREM").arg(registry).arg(job.as_str()))
                        .await?;
                    let exists: i64 = self.conn.query(::redis::cmd("EXISTS").arg(&runs)).await?;
                    if exists > 0 {
                        self.conn
                            .query::<()>(::redis::cmd("SADD").arg(registry).arg(job.as_str()))
                            .await?;
                    }
                    self.registered
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&job);
                }
                if removed >= batch as u64 {
                    // Stay on this page: the caller comes back at once.
                    return Ok(removed);
                }
            }
            *cursor = next;
            if next == 0 || visited >= PRUNE_JOBS_PER_CALL {
                return Ok(removed);
            }
        }
    }

    /// One server only: on a cluster the hash would sit in another slot
    /// than the job's keys, out of the claim script's reach.
    fn keeps_liveness(&self) -> bool {
        !self.conn.is_cluster()
    }

    async fn beat(&self, holder: &Holder) -> Result<u64> {
        if self.conn.is_cluster() {
            return Err(Error::NoLeases(self.info.backend));
        }
        let n: i64 = self
            .conn
            .query(
                ::redis::cmd("HINCRBY")
                    .arg(&self.liveness)
                    .arg(liveness_field(holder))
                    .arg(1),
            )
            .await?;
        Ok(n as u64)
    }

    async fn beats_of(&self, holders: &[Holder]) -> Result<Vec<u64>> {
        if holders.is_empty() || self.conn.is_cluster() {
            return Ok(vec![0; holders.len()]);
        }
        let mut cmd = ::redis::cmd("HMGET");
        cmd.arg(&self.liveness);
        for h in holders {
            cmd.arg(liveness_field(h));
        }
        let v: Vec<Option<i64>> = self.conn.query(&cmd).await?;
        Ok(v.into_iter().map(|c| c.unwrap_or(0) as u64).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_reply(s: &str) -> Result<ClaimReply> {
        ClaimReply::parse(Value::BulkString(s.as_bytes().to_vec()))
    }

    /// The claim script's one-string reply: every field in its place, empty
    /// fields kept, the node last with its spaces; a short or malformed
    /// reply is an error naming the field, never a default.
    #[test]
    fn claim_replies_are_read_field_by_field() {
        let won =
            claim_reply("1 2 1764979200000001 1764979205000 1764979200000 7  1 19adf node a b")
                .unwrap();
        assert_eq!(
            won,
            ClaimReply {
                code: 1,
                attempt: 2,
                fencing: 1_764_979_200_000_001,
                lease_until_ms: 1_764_979_205_000,
                now_ms: 1_764_979_200_000,
                instance: 7,
                reason: None,
                created: true,
                memory_id: "19adf".into(),
                node: "node a b".into(),
            }
        );
        let late = claim_reply("4 0 0 0 1764979200000  too_late 0  ").unwrap();
        assert_eq!(
            (late.code, late.reason, late.created),
            (4, Some("too_late"), false)
        );
        assert_eq!((late.memory_id.as_str(), late.node.as_str()), ("", ""));
        for (reply, field) in [
            ("1 2 3 4 5 6 x 0 id", "node"),
            ("1 2 x 4 5 6  0 id n", "fencing"),
            ("", "code"),
        ] {
            let e = claim_reply(reply).unwrap_err().to_string();
            assert!(e.contains(&format!("({field})")), "{reply:?}: {e}");
        }
        let e = ClaimReply::parse(Value::Array(vec![Value::Int(1)])).unwrap_err();
        assert!(e.to_string().contains("not its reply string"), "{e}");
    }

    #[test]
    fn holder_index_members_are_job_nul_slot() {
        let job = Job::parse("a/b").unwrap();
        assert_eq!(member(&job, 1_700_000_000_000), "a/b\u{0}1700000000000");
        assert_eq!(member(&job, -5), "a/b\u{0}-5");
    }
}
