//! `anarchon serve`: flags → config → telemetry → listeners → run → signals.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::{Config, ConfigError, ConfigFlags, EXIT_CONFIG};
use crate::server::{self, Listeners};

/// `serve` and `check` take the same flags: the config file, and one flag
/// per config key ([`ConfigFlags`], declared with the key in `config.rs`).
/// Every flag has an `ANARCHON_<NAME>` twin and a key `<name>` in the TOML file.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub keys: ConfigFlags,
    /// Once bound, write the actual addresses here, one `name=ADDR` line
    /// each (`grpc=…`, `admin=…`), atomically (FILE.tmp, then renamed): how
    /// to learn the ports of `--listen 127.0.0.1:0`. A flag only (no key).
    #[arg(long, value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
}

impl ServeArgs {
    /// The layered, validated config (defaults, file, environment, flags)
    /// and the runtime it sizes (`worker_threads`). On a bad config: says
    /// which key and why, and gives the exit status (64).
    fn load(&self) -> Result<(Config, tokio::runtime::Runtime), ExitCode> {
        let load = || Config::load(self.config.as_deref(), self.keys.overrides()?);
        let cfg = load().map_err(|e: ConfigError| {
            eprintln!("anarchon: {e}");
            ExitCode::from(EXIT_CONFIG as u8)
        })?;
        let rt = super::runtime(cfg.worker_threads)?;
        Ok((cfg, rt))
    }
}

pub fn serve(args: ServeArgs) -> ExitCode {
    let (cfg, rt) = match args.load() {
        Ok(loaded) => loaded,
        Err(status) => return status,
    };
    crate::telemetry::init(cfg.log_format);
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

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled: a signal that comes in
/// between (say, while `hold` starts its command) is caught, not left to
/// the default action that would kill the process on the spot.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    let set = |sig: i32| STOP_SIGNAL.store(sig, std::sync::atomic::Ordering::Relaxed);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => tokio::select! {
                    _ = term.recv() => set(15),
                    _ = int.recv() => set(2),
                },
                (Ok(mut term), Err(_)) => {
                    term.recv().await;
                    set(15);
                }
                (Err(_), Ok(mut int)) => {
                    int.recv().await;
                    set(2);
                }
                (Err(_), Err(_)) => std::future::pending().await,
            }
        }
    }
    #[cfg(not(unix))]
    {
        let ctrl_c = tokio::signal::ctrl_c();
        async move {
            let _ = ctrl_c.await;
            set(2);
        }
    }
}

/// `anarchon check`: validates the configuration exactly as `serve` would
/// (same flags, env and file) and checks that the store is reachable and
/// migrated. Exits 0 when ready, 64 for a bad config, 1 when the store fails.
pub fn check(args: ServeArgs) -> ExitCode {
    let (cfg, rt) = match args.load() {
        Ok(loaded) => loaded,
        Err(status) => return status,
    };
    println!("config ok");
    rt.block_on(async move {
        let opts = crate::store::StoreOptions::from_config(&cfg);
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
