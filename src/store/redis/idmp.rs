//! Redis `idmp` (Redis ≥ 8.6): the server de-duplicates the claim.
//!
//! Why the step is atomic: `XADD <stream> IDMP <job> <slot_ms> * …` appends
//! the claim only if the server has not seen the pair (producer `job`,
//! idempotent id `slot_ms`) within `IDMP-DURATION`; a duplicate returns the
//! ID of the first entry instead, and that entry's token is the answer. The
//! call runs inside a small script (`idmp.lua`) that also takes `now` from
//! `TIME` (for `LATE`) and, only when it creates the stream, sets
//! `IDMP-DURATION`/`IDMP-MAXSIZE` with `XCFGSET` — `XCFGSET` wipes the
//! de-duplication map, so it must never run on a live stream, and inside the
//! script nothing can come between the creation and the configuration.
//!
//! The server remembers a slot for `idmp_duration_ms` (at most 24 h) and at
//! most `idmp_maxsize` slots per job; a claim whose slot could still be
//! claimed after that (`slot_ms + max_late_ms >= now + duration`) is refused
//! with `INVALID_ARGUMENT`. A job claiming more than `idmp_maxsize` slots
//! within the duration evicts older ones early: size it accordingly.
//!
//! On a server without IDMP, [`IdmpStore::open`] refuses to start and points
//! at the `script` strategy. The happy path has not been run here (this
//! machine has Redis 7.0); its tests run when `ANARCHON_TEST_REDIS_IDMP_URL`
//! names a Redis ≥ 8.6.

use ::redis::Script;

use super::once::{once_store, OnceBase};
use super::{load_script, server_version, Conn, RedisConfig, ScriptCall, Strategy};
use crate::claim::*;
use crate::error::{Error, Result};
use crate::store::StoreInfo;

const IDMP_LUA: &str = include_str!("idmp.lua");

pub struct IdmpStore {
    base: OnceBase,
    script: Script,
    duration_s: u64,
    maxsize: u64,
}

impl IdmpStore {
    pub(crate) async fn open(conn: Conn, cfg: &RedisConfig) -> Result<Self> {
        // Every node must have IDMP (one per master on a cluster).
        let infos = conn.server_infos().await?;
        let versions: Vec<Option<(u32, u32)>> = infos.iter().map(|i| server_version(i)).collect();
        let ok = !versions.is_empty()
            && versions
                .iter()
                .all(|v| matches!(v, Some(v) if *v >= (8, 6)));
        if !ok {
            let found: Vec<String> = versions
                .iter()
                .map(|v| match v {
                    Some((a, b)) => format!("{a}.{b}"),
                    None => "unknown".into(),
                })
                .collect();
            return Err(Error::invalid(
                "backend",
                format!(
                    "the redis idmp strategy needs Redis >= 8.6 (XADD … IDMP, XCFGSET), but the server reports version {}; use strategy=script instead (it works on Redis < 8.6 and Valkey)",
                    found.join(", ")
                ),
            ));
        }
        let script = load_script(&conn, IDMP_LUA).await?;
        let duration_s = cfg.idmp_duration_ms.div_ceil(1000);
        let info = StoreInfo {
            backend: cfg.backend_name(),
            leases: false,
            full_history: false,
            retention: format!(
                "the server remembers a claimed slot for IDMP-DURATION = {duration_s} s (at most {} slots per job) (idmp)",
                cfg.idmp_maxsize
            ),
            identity: cfg.identity(),
        };
        Ok(IdmpStore {
            base: OnceBase::new(conn, &cfg.prefix, Strategy::Idmp, info, duration_s * 2000).await?,
            script,
            duration_s,
            maxsize: cfg.idmp_maxsize,
        })
    }
}

once_store!(IdmpStore, bounded);

impl IdmpStore {
    async fn do_claim(&self, spec: &ClaimSpec) -> Result<ClaimAnswer> {
        let mut inv = ScriptCall::new(&self.script, 1);
        inv.key(self.base.stream_key(&spec.job))
            .arg(spec.job.as_str())
            .arg(spec.slot_ms)
            .arg(spec.token.as_str())
            .arg(&spec.holder.node)
            .arg(spec.holder.instance)
            .arg(spec.max_late_ms)
            .arg(self.duration_s)
            .arg(self.maxsize)
            .arg(self.duration_s * 2000);
        self.base.claim_by_script(spec, &inv).await
    }

    /// What `history` says about what this strategy remembers.
    fn history_note(&self) -> String {
        format!(
            "redis idmp remembers claims for IDMP-DURATION = {} s, and results when released; no leases, attempts or takeovers",
            self.duration_s
        )
    }
}
