//! The one typed configuration.
//!
//! Layers, later wins: built-in defaults → TOML file (`--config`, or
//! `ANARCHON_CONFIG`) → `ANARCHON_*` environment variables → command-line
//! flags. Every key has the name of its `serve` flag with `_` for `-`
//! (`--heartbeat-ms` ↔ `heartbeat_ms` ↔ `ANARCHON_HEARTBEAT_MS`). Unknown
//! keys in the file are errors. [`Config::validate`] runs before any port is
//! bound; a [`ConfigError`] names the key and makes `serve` exit with 64.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize};

use crate::claim::Overlap;

/// Exit status for a bad configuration (EX_USAGE / EX_CONFIG family).
pub const EXIT_CONFIG: i32 = 64;

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("invalid config key `{key}`: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(key: &str, message: impl Into<String>) -> Self {
        ConfigError {
            key: key.to_owned(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// gRPC address for applications and peers.
    pub listen: SocketAddr,
    /// Admin HTTP address (`/healthz`, `/readyz`, `/metrics`).
    pub admin_listen: SocketAddr,
    /// Node key, instance counter, known peers, SQLite file.
    pub data_dir: PathBuf,
    /// Backend URL; empty = `sqlite://<data_dir>/anarchon.db`.
    pub backend: String,
    /// Peer gRPC addresses.
    #[serde(deserialize_with = "string_or_list")]
    pub peer: Vec<String>,
    /// DNS names (NAME:PORT) re-resolved for peers.
    #[serde(deserialize_with = "string_or_list")]
    pub peer_dns: Vec<String>,
    /// The address peers should dial; empty = `listen`.
    pub advertise: String,
    pub heartbeat_ms: u64,
    pub expiry_ms: u64,
    /// Default lease of a claim.
    pub lease_ms: u64,
    /// Largest lease a caller may ask for.
    pub max_lease_ms: u64,
    /// Default lateness allowed after a slot.
    pub max_late_ms: u64,
    /// Default attempts before a run is interrupted.
    pub max_attempts: u32,
    /// Default overlap policy: `allow` or `skip`.
    pub overlap: String,
    /// Largest `wait_ms` a caller may ask for.
    pub max_wait_ms: u64,
    /// A claim of a slot further than this ahead of the store's clock is
    /// `INVALID_ARGUMENT` (a typo, `i64::MAX`, a poison slot).
    pub max_future_ms: u64,
    /// Labels shown to peers (`K=V` strings or a table).
    #[serde(deserialize_with = "labels")]
    pub label: BTreeMap<String, String>,
    /// How long runs are kept (never less than max_late + 1 h).
    pub retention_ms: u64,
    /// SQLite: how long a writer waits for the lock.
    pub busy_timeout_ms: u64,
    /// How long SIGTERM waits for in-flight requests.
    pub drain_ms: u64,
    /// `plain` or `json`.
    pub log_format: String,
    /// Most runtimes the mesh keeps track of.
    pub max_runtimes: usize,
    /// Largest sync frame accepted, in bytes.
    pub max_frame_bytes: usize,
    /// Events a `WatchPeers` client may fall behind before it is cut off.
    pub watch_buffer: usize,
    /// Largest application request, in bytes.
    pub max_request_bytes: usize,
    /// Requests served at once on one connection (more wait).
    pub max_concurrent_per_connection: usize,
    /// Open `Hold` streams allowed per client address.
    pub max_holds_per_client: usize,
    /// `Sync` links accepted at once from one peer runtime.
    pub max_links_per_peer: usize,
    /// Links a runtime aims to keep (it dials about half); the rest of the
    /// mesh is reached through relay.
    pub max_links: usize,
    /// `LEFT` or `EXPIRED` runtimes are forgotten after this long (raised to
    /// 3 × expiry_ms if shorter).
    pub forget_ms: u64,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub mesh_secret_file: Option<PathBuf>,
    pub auth_token_file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            data_dir: PathBuf::from("./anarchon-data"),
            backend: String::new(),
            peer: Vec::new(),
            peer_dns: Vec::new(),
            advertise: String::new(),
            heartbeat_ms: 1_000,
            expiry_ms: 10_000,
            lease_ms: 30_000,
            max_lease_ms: 24 * 3_600_000,
            max_late_ms: 60_000,
            max_attempts: 3,
            overlap: "allow".into(),
            max_wait_ms: 300_000,
            max_future_ms: 24 * 3_600_000,
            label: BTreeMap::new(),
            retention_ms: 7 * 24 * 3_600_000,
            busy_timeout_ms: 5_000,
            drain_ms: 5_000,
            log_format: "plain".into(),
            max_runtimes: 1024,
            max_frame_bytes: 4 << 20,
            watch_buffer: 256,
            max_request_bytes: 64 << 10,
            max_concurrent_per_connection: 256,
            max_holds_per_client: 1024,
            max_links_per_peer: 4,
            max_links: 8,
            forget_ms: 300_000,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            mesh_secret_file: None,
            auth_token_file: None,
        }
    }
}

/// Every key, for the environment filter.
const KEYS: &[&str] = &[
    "listen",
    "admin_listen",
    "data_dir",
    "backend",
    "peer",
    "peer_dns",
    "advertise",
    "heartbeat_ms",
    "expiry_ms",
    "lease_ms",
    "max_lease_ms",
    "max_late_ms",
    "max_attempts",
    "overlap",
    "max_wait_ms",
    "max_future_ms",
    "label",
    "retention_ms",
    "busy_timeout_ms",
    "drain_ms",
    "log_format",
    "max_runtimes",
    "max_frame_bytes",
    "watch_buffer",
    "max_request_bytes",
    "max_concurrent_per_connection",
    "max_holds_per_client",
    "max_links_per_peer",
    "max_links",
    "forget_ms",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "mesh_secret_file",
    "auth_token_file",
];

fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        One(String),
        Many(Vec<String>),
    }
    Ok(match V::deserialize(d)? {
        V::One(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        V::Many(v) => v,
    })
}

fn labels<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        Map(BTreeMap<String, String>),
        Many(Vec<String>),
        One(String),
    }
    let pairs: Vec<String> = match V::deserialize(d)? {
        V::Map(m) => return Ok(m),
        V::Many(v) => v,
        V::One(s) => s.split(',').map(str::to_owned).collect(),
    };
    let mut out = BTreeMap::new();
    for p in pairs.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| serde::de::Error::custom(format!("label {p:?} is not K=V")))?;
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(out)
}

/// figment's message, without its nested backticks for a list of choices
/// (``expected `one of `a`, `b``` reads as unbalanced quoting).
fn kind_message(kind: &figment::error::Kind) -> String {
    use figment::error::Kind;
    let list = |exp: &[&str]| exp.join(", ");
    match kind {
        Kind::UnknownField(found, exp) => {
            format!("unknown key `{found}`; known keys: {}", list(exp))
        }
        Kind::UnknownVariant(found, exp) => {
            format!("unknown value `{found}`; expected one of: {}", list(exp))
        }
        other => other.to_string(),
    }
}

impl Config {
    /// Layers defaults, `file`, the environment and `overrides` (flags that
    /// were given, as a key → value map), then validates.
    pub fn load(
        file: Option<&Path>,
        overrides: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("ANARCHON_CONFIG").map(PathBuf::from));
        if let Some(path) = &file {
            if !path.exists() {
                return Err(ConfigError::new(
                    "config",
                    format!("{} does not exist", path.display()),
                ));
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        fig = fig
            .merge(Env::prefixed("ANARCHON_").only(KEYS))
            .merge(Serialized::defaults(overrides));
        let cfg: Config = fig.extract().map_err(|e| {
            let key = e.path.join(".");
            let key = if key.is_empty() { "config".into() } else { key };
            ConfigError::new(&key, kind_message(&e.kind))
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The shortest lease a claim may ask for: 3 × `heartbeat_ms`.
    pub fn min_lease_ms(&self) -> u64 {
        self.heartbeat_ms.saturating_mul(3)
    }

    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn err(key: &str, message: impl Into<String>) -> ConfigError {
            ConfigError::new(key, message)
        }
        if self.heartbeat_ms < 50 {
            return Err(err("heartbeat_ms", "must be at least 50"));
        }
        if self.expiry_ms < 3 * self.heartbeat_ms {
            return Err(err(
                "expiry_ms",
                format!(
                    "must be at least 3 × heartbeat_ms ({})",
                    3 * self.heartbeat_ms
                ),
            ));
        }
        if self.lease_ms < self.min_lease_ms() {
            return Err(err(
                "lease_ms",
                format!(
                    "must be at least 3 × heartbeat_ms ({} ms)",
                    self.min_lease_ms()
                ),
            ));
        }
        if self.lease_ms > self.max_lease_ms {
            return Err(err(
                "lease_ms",
                format!("exceeds max_lease_ms ({})", self.max_lease_ms),
            ));
        }
        if self.max_lease_ms > i64::MAX as u64 / 4 {
            return Err(err("max_lease_ms", "is too large"));
        }
        if self.max_late_ms > i64::MAX as u64 / 4 {
            return Err(err("max_late_ms", "is too large"));
        }
        if self.max_future_ms == 0 {
            return Err(err("max_future_ms", "must be positive"));
        }
        if self.max_future_ms > i64::MAX as u64 / 4 {
            return Err(err("max_future_ms", "is too large"));
        }
        if self.max_attempts == 0 {
            return Err(err("max_attempts", "must be at least 1"));
        }
        Overlap::parse(&self.overlap).map_err(|_| err("overlap", "must be allow or skip"))?;
        if !matches!(self.log_format.as_str(), "plain" | "json") {
            return Err(err("log_format", "must be plain or json"));
        }
        if self.max_runtimes == 0 {
            return Err(err("max_runtimes", "must be at least 1"));
        }
        if self.max_frame_bytes < 64 << 10 {
            return Err(err("max_frame_bytes", "must be at least 65536"));
        }
        for (key, v) in [
            ("watch_buffer", self.watch_buffer),
            (
                "max_concurrent_per_connection",
                self.max_concurrent_per_connection,
            ),
            ("max_holds_per_client", self.max_holds_per_client),
            ("max_links_per_peer", self.max_links_per_peer),
            ("max_links", self.max_links),
        ] {
            if v == 0 {
                return Err(err(key, "must be at least 1"));
            }
        }
        if self.max_request_bytes < 1024 {
            return Err(err("max_request_bytes", "must be at least 1024"));
        }
        if self.busy_timeout_ms == 0 {
            return Err(err("busy_timeout_ms", "must be positive"));
        }
        let backend = crate::store::Backend::parse(&self.backend_url())
            .map_err(|e| err("backend", e.to_string()))?;
        if let Some((option, ms)) = backend.memory_ms() {
            if ms <= self.max_late_ms {
                return Err(err("backend", format!("{option}={ms} must exceed max_late_ms ({}): a claimed slot must be remembered longer than a late claim may ask", self.max_late_ms)));
            }
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => return Err(err("tls_key", "is required with tls_cert")),
            (None, Some(_)) => return Err(err("tls_cert", "is required with tls_key")),
            _ => {}
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            return Err(err("tls_client_ca", "needs tls_cert and tls_key"));
        }
        if self.tls_cert.is_some()
            && self.tls_client_ca.is_none()
            && !(self.peer.is_empty() && self.peer_dns.is_empty())
        {
            return Err(err(
                "tls_client_ca",
                "is required with TLS and peers: it is the CA peers' certificates are checked against",
            ));
        }
        for (key, path) in [
            ("tls_cert", &self.tls_cert),
            ("tls_key", &self.tls_key),
            ("tls_client_ca", &self.tls_client_ca),
            ("mesh_secret_file", &self.mesh_secret_file),
            ("auth_token_file", &self.auth_token_file),
        ] {
            if let Some(p) = path {
                if !p.is_file() {
                    return Err(err(key, format!("{} is not a readable file", p.display())));
                }
            }
        }
        for p in &self.peer {
            if p.parse::<SocketAddr>().is_err() && !p.contains(':') {
                return Err(err("peer", format!("{p:?} is not HOST:PORT")));
            }
        }
        for p in &self.peer_dns {
            if p.rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .is_none()
            {
                return Err(err("peer_dns", format!("{p:?} is not NAME:PORT")));
            }
        }
        Ok(())
    }

    /// The backend URL, with the SQLite default under `data_dir`.
    pub fn backend_url(&self) -> String {
        if self.backend.is_empty() {
            format!("sqlite://{}", self.data_dir.join("anarchon.db").display())
        } else {
            self.backend.clone()
        }
    }

    /// Retention, never less than max_late + 1 h.
    pub fn retention(&self) -> Duration {
        Duration::from_millis(self.retention_ms.max(self.max_late_ms + 3_600_000))
    }

    pub fn overlap(&self) -> Overlap {
        Overlap::parse(&self.overlap).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn flags(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::default();
        c.validate().unwrap();
        assert!(c.backend_url().starts_with("sqlite://"));
        assert_eq!(c.listen.to_string(), "127.0.0.1:50051");
    }

    #[test]
    fn flags_override_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("anarchon.toml");
        std::fs::write(
            &f,
            "heartbeat_ms = 200\nexpiry_ms = 900\nlabel = { zone = \"a\" }\n",
        )
        .unwrap();
        let c = Config::load(Some(&f), flags(json!({"expiry_ms": 1500}))).unwrap();
        assert_eq!((c.heartbeat_ms, c.expiry_ms), (200, 1500));
        assert_eq!(c.label.get("zone").map(String::as_str), Some("a"));
    }

    #[test]
    fn unknown_key_message_quotes_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("anarchon.toml");
        std::fs::write(&f, "bogus_key = 1\n").unwrap();
        let e = Config::load(Some(&f), Default::default()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("unknown key `bogus_key`; known keys: listen, "),
            "{msg}"
        );
        assert_eq!(msg.matches('`').count() % 2, 0, "unbalanced quoting: {msg}");
        assert!(!msg.contains("`one of"), "{msg}");
    }

    #[test]
    fn unknown_file_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("anarchon.toml");
        std::fs::write(&f, "hartbeat_ms = 200\n").unwrap();
        let e = Config::load(Some(&f), Default::default()).unwrap_err();
        assert!(e.to_string().contains("hartbeat_ms"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key() {
        for (v, key) in [
            (json!({"heartbeat_ms": 10}), "heartbeat_ms"),
            (
                json!({"heartbeat_ms": 1000, "expiry_ms": 2000}),
                "expiry_ms",
            ),
            (json!({"lease_ms": 0}), "lease_ms"),
            (json!({"max_attempts": 0}), "max_attempts"),
            (json!({"overlap": "maybe"}), "overlap"),
            (json!({"backend": "ftp://x"}), "backend"),
            (json!({"listen": "not an address"}), "listen"),
            (json!({"tls_cert": "/nonexistent"}), "tls_key"),
            (json!({"label": ["novalue"]}), "label"),
        ] {
            let e = Config::load(None, flags(v.clone())).unwrap_err();
            assert_eq!(e.key, key, "{v} -> {e}");
        }
    }

    #[test]
    fn retention_is_never_shorter_than_late_claims() {
        let c = Config {
            retention_ms: 1,
            max_late_ms: 1000,
            ..Config::default()
        };
        assert_eq!(c.retention(), Duration::from_millis(3_601_000));
    }
}
