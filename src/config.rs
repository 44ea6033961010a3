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

/// The most worker threads `worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

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

/// Declares every configuration key once: its doc (which is also its flag's
/// help), its type, its default and its flag. From that one list come the
/// typed [`Config`] with its `Default`, the `serve`/`check` flags
/// ([`ConfigFlags`], one `--key-name` per key, whose help shows the default)
/// and [`KEYS`] (the environment filter).
macro_rules! config_keys {
    ($(
        $(#[doc = $doc:literal])*
        $(#[serde($($serde:tt)*)])?
        $key:ident: $ty:ty = $default:expr, flag $flag:ty, $value_name:literal;
    )*) => {
        /// The one typed configuration.
        #[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
        #[serde(deny_unknown_fields, default)]
        pub struct Config {
            $( $(#[doc = $doc])* $(#[serde($($serde)*)])? pub $key: $ty, )*
        }

        impl Default for Config {
            fn default() -> Self {
                Config { $( $key: $default, )* }
            }
        }

        /// One flag per key, named after it. A flag that was not given is
        /// `None` (or empty) and overrides nothing.
        #[derive(Debug, Default, Clone, clap::Args, Serialize)]
        pub struct ConfigFlags {
            $(
                $(#[doc = $doc])*
                #[arg(long, value_name = $value_name)]
                #[serde(skip_serializing_if = "Given::absent")]
                pub $key: $flag,
            )*
        }

        /// Every key, in declaration order.
        pub const KEYS: &[&str] = &[$(stringify!($key)),*];
    };
}

config_keys! {
    /// gRPC address for applications and peers (port 0: any free port; see
    /// --ready-file).
    listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 50051)), flag Option<String>, "ADDR";
    /// Admin HTTP address (`/healthz`, `/readyz`, `/metrics`, the dashboard).
    admin_listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 9464)), flag Option<String>, "ADDR";
    /// A Unix socket that serves applications beside --listen (empty: none):
    /// the same services, for an application on the same host or pod,
    /// without loopback TCP. No TLS on it; the socket file's mode (0600, or
    /// 0660 with --listen-unix-group) and --auth-token-file guard it.
    listen_unix: PathBuf = PathBuf::new(), flag Option<PathBuf>, "PATH";
    /// Let the socket file's group connect to --listen-unix too (mode 0660
    /// instead of 0600): for an application that runs as another user of
    /// that group, as a Kubernetes pod's containers share its fsGroup.
    listen_unix_group: bool = false, flag Option<bool>, "BOOL";
    /// Node key, instance counter, known peers, SQLite file.
    data_dir: PathBuf = PathBuf::from("./anarchon-data"), flag Option<PathBuf>, "DIR";
    /// sqlite://PATH, postgres://…?table=PREFIX, redis://…?strategy=lease|stream-id|idmp|script,
    /// redis+cluster://H:P,H:P?strategy=…, redis+sentinel://H:P,H:P/MASTER?strategy=…,
    /// redis+unix:///PATH?db=N&strategy=…, amqp://…, nats://… (empty: sqlite://<data-dir>/anarchon.db).
    backend: String = String::new(), flag Option<String>, "URL";
    /// A peer's gRPC address; repeatable.
    #[serde(deserialize_with = "string_or_list")]
    peer: Vec<String> = Vec::new(), flag Vec<String>, "ADDR";
    /// A DNS name NAME:PORT re-resolved for peers; repeatable.
    #[serde(deserialize_with = "string_or_list")]
    peer_dns: Vec<String> = Vec::new(), flag Vec<String>, "NAME:PORT";
    /// The address peers should dial (empty: --listen).
    advertise: String = String::new(), flag Option<String>, "ADDR";
    /// Heartbeat period.
    heartbeat_ms: u64 = 1_000, flag Option<u64>, "N";
    /// A peer silent this long is expired.
    expiry_ms: u64 = 10_000, flag Option<u64>, "N";
    /// Links kept with other runtimes (it dials about half); the rest of the
    /// mesh is reached through relay.
    max_links: usize = 8, flag Option<usize>, "N";
    /// Default lease of a claim.
    lease_ms: u64 = 30_000, flag Option<u64>, "N";
    /// Largest lease a caller may ask for.
    max_lease_ms: u64 = 24 * 3_600_000, flag Option<u64>, "N";
    /// Default lateness allowed after a slot.
    max_late_ms: u64 = 60_000, flag Option<u64>, "N";
    /// Default attempts before a run is interrupted.
    max_attempts: u32 = 3, flag Option<u32>, "N";
    /// Default overlap policy: allow or skip.
    overlap: Overlap = Overlap::Allow, flag Option<String>, "POLICY";
    /// Largest wait_ms a caller may ask for.
    max_wait_ms: u64 = 300_000, flag Option<u64>, "N";
    /// A claim of a slot further than this ahead of the store's clock is
    /// refused with INVALID_ARGUMENT (a typo, i64::MAX, a poison slot).
    max_future_ms: u64 = 24 * 3_600_000, flag Option<u64>, "N";
    /// A label K=V shown to peers; repeatable (a table in the file).
    #[serde(deserialize_with = "labels")]
    label: BTreeMap<String, String> = BTreeMap::new(), flag Vec<String>, "K=V";
    /// How long runs are kept (never less than max_late_ms + 1 h).
    retention_ms: u64 = 7 * 24 * 3_600_000, flag Option<u64>, "N";
    /// SQLite: how long a writer waits for the lock.
    busy_timeout_ms: u64 = 5_000, flag Option<u64>, "N";
    /// Worker threads of the async runtime (0: one per core this process may
    /// use, as its CPU quota allows). The SQLite writer's batches run on it;
    /// the WAL flusher and the blocking pool (a SQLite lock wait, the
    /// checkpoint) are extra threads.
    worker_threads: usize = 1, flag Option<usize>, "N";
    /// How long SIGTERM waits for in-flight requests.
    drain_ms: u64 = 5_000, flag Option<u64>, "N";
    /// Log format: plain or json.
    log_format: LogFormat = LogFormat::Plain, flag Option<String>, "FORMAT";
    /// Most runtimes the mesh keeps track of.
    max_runtimes: usize = 1024, flag Option<usize>, "N";
    /// Largest sync frame accepted from a peer, in bytes.
    max_frame_bytes: usize = 4 << 20, flag Option<usize>, "BYTES";
    /// Events a WatchPeers client may fall behind before it is cut off.
    watch_buffer: usize = 256, flag Option<usize>, "N";
    /// Largest application request, in bytes.
    max_request_bytes: usize = 64 << 10, flag Option<usize>, "BYTES";
    /// Requests served at once on one connection (more wait).
    max_concurrent_per_connection: usize = 256, flag Option<usize>, "N";
    /// Open Hold streams allowed per client address.
    max_holds_per_client: usize = 1024, flag Option<usize>, "N";
    /// Sync links accepted at once from one peer runtime.
    max_links_per_peer: usize = 4, flag Option<usize>, "N";
    /// LEFT or EXPIRED runtimes are forgotten after this long (raised to
    /// 3 × expiry_ms if shorter).
    forget_ms: u64 = 300_000, flag Option<u64>, "N";
    /// TLS certificate (PEM) for the gRPC listener.
    tls_cert: Option<PathBuf> = None, flag Option<PathBuf>, "FILE";
    /// TLS private key (PEM).
    tls_key: Option<PathBuf> = None, flag Option<PathBuf>, "FILE";
    /// Require client certificates signed by this CA (mTLS).
    tls_client_ca: Option<PathBuf> = None, flag Option<PathBuf>, "FILE";
    /// Peers must present this secret in the hello.
    mesh_secret_file: Option<PathBuf> = None, flag Option<PathBuf>, "FILE";
    /// Applications must send `authorization: Bearer <token>`.
    auth_token_file: Option<PathBuf> = None, flag Option<PathBuf>, "FILE";
}

/// The log format (`log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Plain,
    Json,
}

/// Whether a flag was given (`skip_serializing_if` of [`ConfigFlags`]).
trait Given {
    fn absent(&self) -> bool;
}

impl<T> Given for Option<T> {
    fn absent(&self) -> bool {
        self.is_none()
    }
}

impl<T> Given for Vec<T> {
    fn absent(&self) -> bool {
        self.is_empty()
    }
}

impl ConfigFlags {
    /// The flags that were given, as config keys (the top layer of
    /// [`Config::load`]).
    pub fn overrides(&self) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => Ok(Default::default()),
            Err(e) => Err(ConfigError::new("config", format!("a flag's value: {e}"))),
        }
    }

    /// `cmd` (a subcommand that flattens [`ConfigFlags`]) with each flag's
    /// help ending in its default, taken from [`Config::default`].
    pub fn show_defaults(mut cmd: clap::Command) -> clap::Command {
        let defaults = serde_json::to_value(Config::default()).unwrap_or_default();
        for key in KEYS {
            let shown = match defaults.get(key) {
                Some(serde_json::Value::Number(n)) => n.to_string(),
                Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
                Some(serde_json::Value::Bool(b)) => b.to_string(),
                _ => continue,
            };
            cmd = cmd.mut_arg(*key, |arg| {
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                let arg = arg.help(format!("{help} [default: {shown}]"));
                match arg.get_long_help().map(|h| h.to_string()) {
                    Some(long) => arg.long_help(format!("{long} [default: {shown}]")),
                    None => arg,
                }
            });
        }
        cmd
    }
}

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
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(err(
                "worker_threads",
                format!("must be at most {MAX_WORKER_THREADS} (0: one per core)"),
            ));
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
    fn worker_threads_is_bounded_and_named() {
        for n in [0, 1, MAX_WORKER_THREADS] {
            let c = Config::load(None, flags(json!({ "worker_threads": n }))).unwrap();
            assert_eq!(c.worker_threads, n);
        }
        let e = Config::load(
            None,
            flags(json!({ "worker_threads": MAX_WORKER_THREADS + 1 })),
        )
        .unwrap_err();
        assert!(e.to_string().contains("worker_threads"), "{e}");
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
    fn every_key_has_one_flag_showing_its_default() {
        use clap::{Args, Command};
        let cmd = ConfigFlags::show_defaults(ConfigFlags::augment_args(Command::new("serve")));
        let mut longs: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        let mut keys: Vec<String> = KEYS.iter().map(|k| k.replace('_', "-")).collect();
        longs.sort();
        keys.sort();
        assert_eq!(longs, keys, "one flag per key");
        let defaults = serde_json::to_value(Config::default()).unwrap();
        assert_eq!(
            defaults.as_object().map(|m| m.len()),
            Some(KEYS.len()),
            "KEYS lists every field"
        );
        let help = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default()
        };
        assert!(
            help("heartbeat_ms").ends_with("[default: 1000]"),
            "{}",
            help("heartbeat_ms")
        );
        assert!(
            help("overlap").ends_with("[default: allow]"),
            "{}",
            help("overlap")
        );
        assert!(help("log_format").ends_with("[default: plain]"));
        assert!(
            !help("backend").contains("[default:"),
            "an empty default is not shown"
        );
    }

    #[test]
    fn only_given_flags_override() {
        use clap::{Args, Command, FromArgMatches};
        let cmd = ConfigFlags::augment_args(Command::new("serve"));
        let m = cmd
            .try_get_matches_from([
                "serve",
                "--heartbeat-ms",
                "200",
                "--peer",
                "a:1",
                "--peer",
                "b:2",
                "--overlap",
                "SKIP",
            ])
            .unwrap();
        let flags = ConfigFlags::from_arg_matches(&m).unwrap();
        let o = flags.overrides().unwrap();
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["heartbeat_ms", "overlap", "peer"]);
        let c = Config::load(None, o).unwrap();
        assert_eq!(c.heartbeat_ms, 200);
        assert_eq!(c.peer, ["a:1", "b:2"]);
        assert_eq!(c.overlap, Overlap::Skip);
        assert_eq!(c.expiry_ms, Config::default().expiry_ms);
    }

    #[test]
    fn enums_name_their_key() {
        let e = Config::load(None, flags(json!({"log_format": "xml"}))).unwrap_err();
        assert_eq!(e.key, "log_format", "{e}");
        assert!(e.message.contains("plain, json"), "{e}");
        let c = Config::load(None, flags(json!({"log_format": "json"}))).unwrap();
        assert_eq!(c.log_format, LogFormat::Json);
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
