//! Redis `script`: one Lua script looks for the slot in the job's recent
//! claims and appends the caller's claim if it is not there.
//!
//! Why the step is atomic: Redis runs the script (`script.lua`, `EVALSHA`,
//! reloaded on `NOSCRIPT`) to completion before any other command, so the
//! scan of the job's stream and the append cannot be interleaved with
//! another claim of the job. The script returns the token that holds the
//! slot; the caller won exactly when it is its own. `now` is Redis's `TIME`.
//!
//! The stream only remembers the last `window_ms` (entries are trimmed with
//! `MINID ~` and the key expires `window_ms` after its last claim). A claim
//! whose slot could still be claimed after the window forgot it
//! (`slot_ms + max_late_ms >= now + window_ms`) is refused with
//! `INVALID_ARGUMENT` instead of risking a second winner later. Works on
//! Redis < 8.6 and Valkey.

use ::redis::Script;

use super::once::{once_store, OnceBase};
use super::{load_script, Conn, RedisConfig, ScriptCall, Strategy};
use crate::claim::*;
use crate::error::Result;
use crate::store::StoreInfo;

const SCRIPT_LUA: &str = include_str!("script.lua");

pub struct ScriptStore {
    base: OnceBase,
    script: Script,
    window_ms: u64,
}

impl ScriptStore {
    pub(crate) async fn open(conn: Conn, cfg: &RedisConfig) -> Result<Self> {
        let script = load_script(&conn, SCRIPT_LUA).await?;
        let window = crate::duration::human(std::time::Duration::from_millis(cfg.window_ms));
        let info = StoreInfo {
            backend: cfg.backend_name(),
            leases: false,
            full_history: false,
            retention: format!("claims are kept for window_ms = {window} (script)"),
            identity: cfg.identity(),
        };
        Ok(ScriptStore {
            base: OnceBase::new(conn, &cfg.prefix, Strategy::Script, info, cfg.window_ms).await?,
            script,
            window_ms: cfg.window_ms,
        })
    }
}

once_store!(ScriptStore, bounded);

impl ScriptStore {
    async fn do_claim(&self, spec: &ClaimSpec) -> Result<ClaimAnswer> {
        let mut inv = ScriptCall::new(&self.script, 1);
        inv.key(self.base.stream_key(&spec.job))
            .arg(spec.slot_ms)
            .arg(spec.token.as_str())
            .arg(&spec.holder.node)
            .arg(spec.holder.instance)
            .arg(spec.max_late_ms)
            .arg(self.window_ms);
        self.base.claim_by_script(spec, &inv).await
    }

    /// What `history` says about what this strategy remembers.
    fn history_note(&self) -> String {
        format!(
            "redis script remembers claims for window_ms = {} ms, and results when released; no leases, attempts or takeovers",
            self.window_ms
        )
    }
}
