//! `anarchon serve`: flags → config → telemetry → listeners → run → signals.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Map, Value};

use crate::config::{Config, EXIT_CONFIG};
use crate::server::{self, Listeners};

/// Every flag has an `ANARCHON_<NAME>` twin and a key `<name>` in the TOML file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// gRPC address for applications and peers [default: 127.0.0.1:50051].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin HTTP address [default: 127.0.0.1:9464].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Node key, instance counter, known peers, SQLite file [default: ./anarchon-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// sqlite://PATH, postgres://…?table=PREFIX, redis://…?strategy=lease|stream-id|idmp|script,
    /// redis+cluster://H:P,H:P?strategy=…, redis+sentinel://H:P,H:P/MASTER?strategy=…,
    /// amqp://…, nats://…
    /// [default: sqlite://<data-dir>/anarchon.db].
    #[arg(long, value_name = "URL")]
    pub backend: Option<String>,
    /// A peer's gRPC address; repeatable.
    #[arg(long, value_name = "ADDR")]
    pub peer: Vec<String>,
    /// A DNS name NAME:PORT re-resolved for peers; repeatable.
    #[arg(long, value_name = "NAME:PORT")]
    pub peer_dns: Vec<String>,
    /// The address peers should dial [default: --listen].
    #[arg(long, value_name = "ADDR")]
    pub advertise: Option<String>,
    /// Heartbeat period [default: 1000].
    #[arg(long, value_name = "N")]
    pub heartbeat_ms: Option<u64>,
    /// A peer silent this long is expired [default: 10000].
    #[arg(long, value_name = "N")]
    pub expiry_ms: Option<u64>,
    /// Links kept with other runtimes; the rest is relayed [default: 8].
    #[arg(long, value_name = "N")]
    pub max_links: Option<u64>,
    /// Default lease [default: 30000].
    #[arg(long, value_name = "N")]
    pub lease_ms: Option<u64>,
    /// Largest lease a caller may ask for [default: 86400000].
    #[arg(long, value_name = "N")]
    pub max_lease_ms: Option<u64>,
    /// Default lateness allowed after a slot [default: 60000].
    #[arg(long, value_name = "N")]
    pub max_late_ms: Option<u64>,
    /// Default attempts before a run is interrupted [default: 3].
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,
    /// Default overlap policy: allow or skip [default: allow].
    #[arg(long, value_name = "POLICY")]
    pub overlap: Option<String>,
    /// Largest wait_ms a caller may ask for [default: 300000].
    #[arg(long, value_name = "N")]
    pub max_wait_ms: Option<u64>,
    /// Slots further ahead of the store's clock are refused [default: 86400000].
    #[arg(long, value_name = "N")]
    pub max_future_ms: Option<u64>,
    /// A label K=V shown to peers; repeatable.
    #[arg(long, value_name = "K=V")]
    pub label: Vec<String>,
    /// How long runs are kept [default: 7 days; never less than max-late + 1 h].
    #[arg(long, value_name = "N")]
    pub retention_ms: Option<u64>,
    /// SQLite: how long a writer waits for the lock [default: 5000].
    #[arg(long, value_name = "N")]
    pub busy_timeout_ms: Option<u64>,
    /// How long SIGTERM waits for in-flight requests [default: 5000].
    #[arg(long, value_name = "N")]
    pub drain_ms: Option<u64>,
    /// Log format: plain or json [default: plain].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// TLS certificate (PEM) for the gRPC listener.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (mTLS).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Peers must present this secret in the hello.
    #[arg(long, value_name = "FILE")]
    pub mesh_secret_file: Option<PathBuf>,
    /// Applications must send `authorization: Bearer <token>`.
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Once bound, write the actual addresses here, one `name=ADDR` line
    /// each (`grpc=…`, `admin=…`), atomically (FILE.tmp, then renamed): how
    /// to learn the ports of `--listen 127.0.0.1:0`. A flag only (no key).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
}

impl ServeArgs {
    /// The flags that were given, as config keys.
    fn overrides(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_owned(), v);
        };
        let s = |v: &Option<String>| v.clone().map(Value::from);
        let p = |v: &Option<PathBuf>| v.as_ref().map(|p| Value::from(p.display().to_string()));
        for (k, v) in [
            ("listen", s(&self.listen)),
            ("admin_listen", s(&self.admin_listen)),
            ("data_dir", p(&self.data_dir)),
            ("backend", s(&self.backend)),
            ("advertise", s(&self.advertise)),
            ("heartbeat_ms", self.heartbeat_ms.map(Value::from)),
            ("expiry_ms", self.expiry_ms.map(Value::from)),
            ("max_links", self.max_links.map(Value::from)),
            ("lease_ms", self.lease_ms.map(Value::from)),
            ("max_lease_ms", self.max_lease_ms.map(Value::from)),
            ("max_late_ms", self.max_late_ms.map(Value::from)),
            ("max_attempts", self.max_attempts.map(Value::from)),
            ("overlap", s(&self.overlap)),
            ("max_wait_ms", self.max_wait_ms.map(Value::from)),
            ("max_future_ms", self.max_future_ms.map(Value::from)),
            ("retention_ms", self.retention_ms.map(Value::from)),
            ("busy_timeout_ms", self.busy_timeout_ms.map(Value::from)),
            ("drain_ms", self.drain_ms.map(Value::from)),
            ("log_format", s(&self.log_format)),
            ("tls_cert", p(&self.tls_cert)),
            ("tls_key", p(&self.tls_key)),
            ("tls_client_ca", p(&self.tls_client_ca)),
            ("mesh_secret_file", p(&self.mesh_secret_file)),
            ("auth_token_file", p(&self.auth_token_file)),
        ] {
            if let Some(v) = v {
                put(k, v);
            }
        }
        if !self.peer.is_empty() {
            put("peer", Value::from(self.peer.clone()));
        }
        if !self.peer_dns.is_empty() {
            put("peer_dns", Value::from(self.peer_dns.clone()));
        }
        if !self.label.is_empty() {
            put("label", Value::from(self.label.clone()));
        }
        m
    }
}

pub fn serve(rt: &tokio::runtime::Runtime, args: ServeArgs) -> ExitCode {
    let cfg = match Config::load(args.config.as_deref(), args.overrides()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("anarchon: {e}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    crate::telemetry::init(&cfg.log_format);
    // Refuse a second process on this data dir before binding anything, with
    // the owner's pid (`run` takes the lock for good).
    if let Err(e) = crate::mesh::identity::DataDirLock::acquire(&cfg.data_dir) {
        eprintln!("anarchon: {e}");
        return ExitCode::FAILURE;
    }
    rt.block_on(async move {
        let listeners = match Listeners::bind(&cfg, args.ready_file.as_deref()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = super::anyhow_chain(&e), "cannot bind");
                return ExitCode::FAILURE;
            }
        };
        match server::run(cfg, listeners, shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = super::anyhow_chain(&e), "sidecar failed");
                ExitCode::FAILURE
            }
        }
    })
}

/// The signal [`shutdown_signal`] last resolved on (15 SIGTERM, 2 SIGINT).
static STOP_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(15);

/// The exit status for a process stopped by [`shutdown_signal`]: 128 + the
/// signal, as a shell reports it (130 after Ctrl-C, 143 after SIGTERM).
pub fn stopped_exit_status() -> u8 {
    (128 + STOP_SIGNAL.load(std::sync::atomic::Ordering::Relaxed)).clamp(0, 255) as u8
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let set = |sig: i32| STOP_SIGNAL.store(sig, std::sync::atomic::Ordering::Relaxed);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => set(15),
                    _ = tokio::signal::ctrl_c() => set(2),
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                set(2);
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        set(2);
    }
}

/// `anarchon check`: validates the configuration exactly as `serve` would
/// (same flags, env and file) and checks that the store is reachable and
/// migrated. Exits 0 when ready, 64 for a bad config, 1 when the store fails.
pub fn check(rt: &tokio::runtime::Runtime, args: ServeArgs) -> ExitCode {
    let cfg = match Config::load(args.config.as_deref(), args.overrides()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("anarchon: {e}");
            return ExitCode::from(EXIT_CONFIG as u8);
        }
    };
    println!("config ok");
    rt.block_on(async move {
        let opts = crate::store::StoreOptions {
            retention: cfg.retention(),
            busy_timeout: std::time::Duration::from_millis(cfg.busy_timeout_ms),
            max_future: std::time::Duration::from_millis(cfg.max_future_ms),
        };
        let url = cfg.backend_url();
        match crate::store::open(&url, &opts).await {
            Ok(store) => match store.ping().await {
                Ok(()) => {
                    println!(
                        "store ok: {} ({})",
                        store.info().backend,
                        server::redact(&url)
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("anarchon: store check failed: {e}");
                    ExitCode::FAILURE
                }
            },
            Err(e) => {
                eprintln!(
                    "anarchon: cannot open backend {}: {e}",
                    server::redact(&url)
                );
                ExitCode::FAILURE
            }
        }
    })
}
