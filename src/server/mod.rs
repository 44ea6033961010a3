//! The sidecar process: [`run`] takes already-bound listeners, a validated
//! [`Config`] and a shutdown future, and serves until the future resolves.
//!
//! Start-up: data dir lock (one process per data dir) → store (connect,
//! migrate) → identity (node key + instance bump) → gRPC (Claims, Mesh,
//! health, reflection) and admin HTTP. Shutdown
//! (SIGTERM): health turns NOT_SERVING, waits stop, `Hold` streams end (and
//! their clients get a moment to stop their commands), then the LEFT mark
//! goes out and the leases this runtime holds end at once (the next claimer
//! takes each run over), and in-flight requests drain for up to `drain_ms`.

pub mod admin;
pub mod auth;
pub mod claims;
pub mod convert;
pub mod dashboard;
pub mod grpc_errors;
pub mod mesh;
pub mod mesh_state;
pub mod metrics;
pub mod runs;
pub mod tls;
pub mod validate;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;

use crate::liveness::{Guard, GuardConfig};
use crate::mesh::identity::DataDirLock;
use crate::mesh::{Identity, Mesh, MeshConfig};
use crate::proto as pb;
use crate::store::{self, StoreOptions};
use crate::Config;

pub use claims::{ClaimsService, ClaimsState};

/// The bound sockets the sidecar serves on.
pub struct Listeners {
    pub grpc: TcpListener,
    pub admin: Option<TcpListener>,
    /// `listen_unix`: applications on the same host, without loopback TCP.
    pub unix: Option<UnixSocket>,
}

/// A bound Unix socket and its file, removed when dropped (the server has
/// stopped, or never started).
pub struct UnixSocket {
    listener: tokio::net::UnixListener,
    file: SocketFile,
}

/// Removes a Unix socket's file when dropped.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl UnixSocket {
    /// Binds `path` with mode 0600, or 0660 when `group` may connect too
    /// (`listen_unix_group`). A socket file left by a sidecar that is gone
    /// is replaced; one that a live server still answers on, or a path that
    /// is not a socket, is an error naming `listen_unix`: nothing is removed.
    ///
    /// The socket is bound under a temporary name beside `path`, given its
    /// mode, and only then renamed to `path`: nobody can connect to `path`
    /// while it still has the mode the process umask gave it.
    pub fn bind(path: &Path, group: bool) -> anyhow::Result<UnixSocket> {
        use std::os::unix::fs::PermissionsExt;
        let bad = |why: &str| anyhow::anyhow!("listen_unix {}: {why}", path.display());
        replace_stale(path).map_err(|why| bad(&why))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        replace_stale(&tmp).map_err(|why| bad(&format!("{}: {why}", tmp.display())))?;
        let listener =
            tokio::net::UnixListener::bind(&tmp).map_err(|e| bad(&format!("cannot bind: {e}")))?;
        let mode = if group { 0o660 } else { 0o600 };
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
            .map_err(|e| bad(&format!("cannot set its mode to {mode:o}: {e}")))
            .and_then(|()| {
                std::fs::rename(&tmp, path)
                    .map_err(|e| bad(&format!("cannot rename {} to it: {e}", tmp.display())))
            });
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(UnixSocket {
            listener,
            file: SocketFile(path.to_owned()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.file.0
    }
}

/// Makes `path` free for a new socket: nothing there, or a socket file no
/// server answers on (removed). Anything else is refused, and kept.
fn replace_stale(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            Err("exists and is not a socket; not replaced".into())
        }
        Ok(_) if std::os::unix::net::UnixStream::connect(path).is_ok() => {
            Err("a running server answers on it".into())
        }
        Ok(_) => {
            std::fs::remove_file(path).map_err(|e| format!("cannot remove the stale socket: {e}"))
        }
        Err(_) => Ok(()),
    }
}

impl Listeners {
    /// Binds the configured addresses; then, given a `ready_file`, writes
    /// the bound addresses to it (see [`Listeners::write_ready_file`]).
    pub async fn bind(cfg: &Config, ready_file: Option<&Path>) -> anyhow::Result<Listeners> {
        let grpc = TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("cannot bind listen address {}", cfg.listen))?;
        let admin = TcpListener::bind(cfg.admin_listen)
            .await
            .with_context(|| format!("cannot bind admin_listen address {}", cfg.admin_listen))?;
        let unix = if cfg.listen_unix.as_os_str().is_empty() {
            None
        } else {
            Some(UnixSocket::bind(&cfg.listen_unix, cfg.listen_unix_group)?)
        };
        let listeners = Listeners {
            grpc,
            admin: Some(admin),
            unix,
        };
        if let Some(path) = ready_file {
            listeners.write_ready_file(path)?;
        }
        Ok(listeners)
    }

    /// Writes the bound addresses to `path`, one `name=ADDR` line each
    /// (`grpc=…`, then `admin=…`; the mesh shares the gRPC listener), so a
    /// caller that asked for port 0 learns the ports. Atomic: written to
    /// `PATH.tmp`, then renamed, so a reader sees all of it or nothing.
    pub fn write_ready_file(&self, path: &Path) -> anyhow::Result<()> {
        let mut text = format!("grpc={}\n", self.grpc.local_addr()?);
        if let Some(admin) = &self.admin {
            text.push_str(&format!("admin={}\n", admin.local_addr()?));
        }
        if let Some(unix) = &self.unix {
            text.push_str(&format!("unix={}\n", unix.path().display()));
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, text)
            .with_context(|| format!("cannot write ready file {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot write ready file {}", path.display()))
    }
}

/// On SIGTERM, how long `Hold` clients get between the end of their stream
/// and the moment peers may take their runs over (the LEFT mark): `hold`
/// kills its command's process group as soon as its stream ends.
const HOLD_CLIENTS_MARGIN: Duration = Duration::from_millis(100);

/// Serves until `shutdown` resolves, then drains.
pub async fn run(
    cfg: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // One process per data dir, held until `run` returns; taken before the
    // instance is bumped, and the store is opened before it too, so a start
    // that fails leaves the instance where it was.
    let _data_dir_lock = DataDirLock::acquire(&cfg.data_dir)?;
    let opts = StoreOptions::from_config(&cfg);
    let url = cfg.backend_url();
    let store = store::open(&url, &opts)
        .await
        .with_context(|| format!("cannot open backend {}", redact(&url)))?;

    let identity =
        Arc::new(Identity::load_or_create(&cfg.data_dir).context("cannot load the node identity")?);
    let holder = identity.holder();
    let grpc_addr = listeners.grpc.local_addr()?;
    tracing::info!(node = %identity.node, instance = identity.instance, listen = %grpc_addr, "starting");
    tracing::info!(
        backend = store.info().backend,
        store_identity = %store.info().identity,
        "store ready"
    );

    let advertise = if cfg.advertise.is_empty() {
        grpc_addr.to_string()
    } else {
        cfg.advertise.clone()
    };
    let secret = cfg
        .mesh_secret_file
        .as_deref()
        .map(|p| auth::read_secret("mesh_secret_file", p))
        .transpose()?;
    let app_auth = auth::Auth::new(
        cfg.auth_token_file
            .as_deref()
            .map(|p| auth::read_secret("auth_token_file", p))
            .transpose()?,
    );
    let tls = tls::load(&cfg)?;
    let (drain_tx, drain_rx) = watch::channel(false);
    let (mesh_stop_tx, mesh_stop_rx) = watch::channel(false);
    let guard_stop = mesh_stop_rx.clone();
    let (changed, _) = watch::channel(0u64);
    let mut mesh_cfg = MeshConfig::from_config(
        &cfg,
        advertise,
        secret,
        tls.as_ref().map(|t| t.peer_client.clone()),
    );
    mesh_cfg.store_identity = store.info().identity.clone();
    let mesh = Mesh::start(identity.clone(), mesh_cfg, mesh_stop_rx, changed.clone());

    // Store-confirmed liveness (docs/safety.md): refresh our record before
    // serving, so the first claim can be promised a lease.
    let guard = Guard::new(
        store.clone(),
        holder.clone(),
        mesh.clone(),
        GuardConfig {
            heartbeat: Duration::from_millis(cfg.heartbeat_ms),
            expiry: Duration::from_millis(cfg.expiry_ms),
        },
        changed.clone(),
    );
    if guard.bounded() {
        if let Err(e) = guard.refresh().await {
            tracing::warn!(error = %e, "cannot refresh this sidecar's liveness record yet");
        }
    }
    guard.spawn(guard_stop);

    let metrics = Arc::new(metrics::Metrics::default());
    let runs = Arc::new(runs::RunFeed::default());
    metrics.store_up.set(1);
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    metrics
        .runtime_workers
        .set(i64::try_from(workers).unwrap_or(i64::MAX));
    let state = Arc::new(ClaimsState {
        store: store.clone(),
        defaults: validate::ClaimDefaults::from_config(&cfg),
        holder: holder.clone(),
        metrics: metrics.clone(),
        guard: guard.clone(),
        mesh: Some(mesh.clone()),
        changed,
        poll: Duration::from_millis(cfg.heartbeat_ms),
        shutdown: drain_rx,
        holds: claims::HoldLimiter::new(cfg.max_holds_per_client),
        runs: runs.clone(),
    });

    let (health, health_svc) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::claims_server::ClaimsServer<ClaimsService>>()
        .await;
    health
        .set_serving::<pb::mesh_server::MeshServer<mesh::MeshService>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // Both reflection versions: grpcurl speaks v1, while Python's
    // grpcio-reflection and grpc-requests still speak v1alpha.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("reflection")?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("reflection v1alpha")?;

    let mesh_svc = mesh::MeshService {
        mesh: mesh.clone(),
        auth: app_auth.clone(),
    };

    let pruner = tokio::spawn(store::prune_loop(
        store.clone(),
        cfg.retention(),
        Duration::from_secs(60),
    ));

    // Shutdown fan-out: the first signal starts the drain everywhere.
    let (stop_tx, stop_rx) = watch::channel(false);
    {
        let health = health.clone();
        let store = store.clone();
        let holder = holder.clone();
        let mesh = mesh.clone();
        let guard = guard.clone();
        let metrics = metrics.clone();
        let drain = Duration::from_millis(cfg.drain_ms);
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("draining");
            // Promise nothing more, and tell every Hold stream LOST_LEASE
            // (sidecar_leaving) before the peers may take our runs over.
            guard.close();
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            health
                .set_not_serving::<pb::claims_server::ClaimsServer<ClaimsService>>()
                .await;
            // End the Hold streams first and let their clients act on it
            // (`hold` kills its command when its stream ends): the LEFT mark
            // and the ended leases below let peers take the runs over at
            // once, and a command must not still run then.
            let _ = drain_tx.send(true);
            // Each stream waits until its LOST_LEASE is written.
            let until = tokio::time::Instant::now() + drain / 2;
            while metrics.holds_open.get() > 0 && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if metrics.holds_open.get() > 0 {
                tracing::warn!("some Hold streams did not end within half the drain");
            }
            tokio::time::sleep(HOLD_CLIENTS_MARGIN.min(drain / 2)).await;
            // Then tell the peers, so they stop counting on us at once.
            mesh.leave().await;
            let ended = match store.leases() {
                Some(l) => l.end_leases_of(&holder).await,
                None => Ok(0),
            };
            match ended {
                Ok(n) if n > 0 => tracing::info!(runs = n, "ended the leases this runtime held"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not end held leases on leave"),
            }
            let _ = stop_tx.send(true);
            let _ = mesh_stop_tx.send(true);
        });
    }
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let admin_auth = app_auth.clone();
    let admin_task = match listeners.admin {
        Some(l) => {
            let router = admin::router(admin::AdminState {
                store: store.clone(),
                metrics: metrics.clone(),
                mesh: mesh.clone(),
                auth: admin_auth,
                dashboard: Arc::new(dashboard::Dashboard::new(
                    runs,
                    Duration::from_millis(cfg.heartbeat_ms),
                    Duration::from_millis(cfg.expiry_ms),
                )),
            });
            let stop = stopped(stop_rx.clone());
            Some(tokio::spawn(async move {
                axum::serve(l, router).with_graceful_shutdown(stop).await
            }))
        }
        None => None,
    };

    let routes = tonic::service::Routes::new(health_svc)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            pb::claims_server::ClaimsServer::new(ClaimsService(state))
                .max_decoding_message_size(cfg.max_request_bytes),
            app_auth,
        ))
        .add_service(
            pb::mesh_server::MeshServer::new(mesh_svc)
                .max_decoding_message_size(cfg.max_frame_bytes)
                .max_encoding_message_size(cfg.max_frame_bytes),
        );
    // HTTP/2 keepalive: a client that stops answering pings (frozen,
    // partitioned) loses its connection, so its Hold streams end and their
    // leases with them, within heartbeat + expiry/2 (docs/safety.md). The
    // Unix socket's connections get the same settings.
    let server = || {
        tonic::transport::Server::builder()
            .concurrency_limit_per_connection(cfg.max_concurrent_per_connection)
            .http2_keepalive_interval(Some(Duration::from_millis(cfg.heartbeat_ms)))
            .http2_keepalive_timeout(Some(Duration::from_millis(cfg.expiry_ms / 2)))
    };
    let mut builder = server();
    if let Some(t) = &tls {
        builder = builder.tls_config(t.server.clone()).context("TLS")?;
    }
    let tcp = builder
        .layer(grpc_errors::DecodeErrors::new(metrics.clone()))
        .add_routes(routes.clone())
        .serve_with_incoming_shutdown(
            // No Nagle: a small stream event (LOST_LEASE, a beat) must not
            // wait for the ACK of the previous one (up to 40 ms).
            TcpListenerStream::new(listeners.grpc).map(|conn| {
                if let Ok(c) = &conn {
                    let _ = c.set_nodelay(true);
                }
                conn
            }),
            stopped(stop_rx.clone()),
        );
    // The same services on `listen_unix`, without TLS (a local socket),
    // and its file removed once both servers have stopped.
    let (unix, _socket_file) = match listeners.unix {
        Some(UnixSocket { listener, file }) => {
            tracing::info!(listen_unix = %file.0.display(), "serving applications on a Unix socket");
            let serve = server()
                .layer(grpc_errors::DecodeErrors::new(metrics.clone()))
                .add_routes(routes)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    stopped(stop_rx.clone()),
                );
            (Some(serve), Some(file))
        }
        None => (None, None),
    };
    let grpc = async move {
        let unix = async move {
            match unix {
                Some(serve) => serve.await.context("gRPC server on listen_unix"),
                None => Ok(()),
            }
        };
        tokio::try_join!(async { tcp.await.context("gRPC server") }, unix).map(|_| ())
    };
    let drain = Duration::from_millis(cfg.drain_ms);
    let mut grpc = Box::pin(grpc);
    tokio::select! {
        res = &mut grpc => res?,
        _ = async {
            stopped(stop_rx.clone()).await;
            tokio::time::sleep(drain).await;
        } => tracing::warn!("drain period over; closing remaining streams"),
    }
    if let Some(t) = admin_task {
        t.abort();
    }
    pruner.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Hides a password in a URL for logs.
pub use crate::store::backend_url::redact;
