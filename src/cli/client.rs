//! Client subcommands: thin wrappers over the gRPC API that print text or JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use super::{ClientOpts, EXIT_NOT_WON};
use crate::error::status_reason;
use crate::proto as pb;
use crate::server::mesh_state::{link_name, peer_state_name};

/// Adds `authorization: Bearer <token>` when a token is configured.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type ClaimsClient = pb::claims_client::ClaimsClient<InterceptedService<Channel, Bearer>>;
pub type MeshClient = pb::mesh_client::MeshClient<InterceptedService<Channel, Bearer>>;

/// Connects to the sidecar at `opts.server`.
pub async fn connect(opts: &ClientOpts) -> anyhow::Result<(ClaimsClient, MeshClient)> {
    let bearer = match &opts.auth_token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p)?;
            Some(MetadataValue::try_from(format!("Bearer {}", t.trim()))?)
        }
        None => None,
    };
    let unreachable = |e: tonic::transport::Error| {
        anyhow::Error::new(e).context(format!("cannot reach the sidecar at {}", opts.server))
    };
    let channel = match unix_path(&opts.server) {
        Some(path) => {
            if opts.tls_ca.is_some() {
                anyhow::bail!("--tls-ca: a Unix socket ({}) carries no TLS", opts.server);
            }
            unix_channel(path.into()).await.map_err(unreachable)?
        }
        None => tcp_endpoint(opts)?.connect().await.map_err(unreachable)?,
    };
    Ok((
        pb::claims_client::ClaimsClient::with_interceptor(channel.clone(), Bearer(bearer.clone())),
        pb::mesh_client::MeshClient::with_interceptor(channel, Bearer(bearer)),
    ))
}

/// The endpoint of a `host:port` (or URI) server address, with TLS when
/// `--tls-ca` is given.
fn tcp_endpoint(opts: &ClientOpts) -> anyhow::Result<Endpoint> {
    let scheme = if opts.tls_ca.is_some() {
        "https"
    } else {
        "http"
    };
    let uri = if opts.server.contains("://") {
        opts.server.clone()
    } else {
        format!("{scheme}://{}", opts.server)
    };
    let mut endpoint = Channel::from_shared(uri)?.connect_timeout(Duration::from_secs(5));
    if let Some(ca) = &opts.tls_ca {
        crate::server::tls::install_crypto_provider();
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(ca)?));
        if let (Some(c), Some(k)) = (&opts.tls_client_cert, &opts.tls_client_key) {
            tls = tls.identity(tonic::transport::Identity::from_pem(
                std::fs::read(c)?,
                std::fs::read(k)?,
            ));
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(endpoint)
}

/// The socket path of a `unix:PATH` or `unix://PATH` server address (the
/// forms gRPC's own clients take), else `None`.
pub fn unix_path(server: &str) -> Option<&str> {
    let rest = server.strip_prefix("unix:")?;
    Some(rest.strip_prefix("//").unwrap_or(rest))
}

/// One connection to a sidecar's Unix socket (`listen_unix`). The URI is
/// not dialled (the connector is); it names the HTTP/2 `:authority`.
pub async fn unix_channel(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// Connects, or reports why not (text or JSON) and returns exit status 1.
async fn connect_or_report(opts: &ClientOpts) -> Result<(ClaimsClient, MeshClient), ExitCode> {
    connect(opts).await.map_err(|e| fail(opts.json, e))
}

/// The `--slot` forms, for messages and `--help`.
pub const SLOT_FORMS: &str =
    "epoch milliseconds, or `now/PERIOD` — this host's clock rounded down \
     to a whole PERIOD since the epoch (UTC): now/1m, now/5m, now/1h, now/1d, any now/<duration>";

/// Parses `--slot`: epoch milliseconds, or `now/PERIOD`.
pub fn parse_slot(s: &str) -> Result<i64, String> {
    slot_at(s, crate::claim::host_now_ms())
}

/// [`parse_slot`] with the current time given. A bare `now` is refused: it
/// is a new slot every millisecond, so two instances claiming "the same"
/// run at once would both win.
fn slot_at(s: &str, now_ms: i64) -> Result<i64, String> {
    if s == "now" {
        return Err(format!(
            "a bare `now` is a different slot every millisecond (two instances would both win); \
             use {SLOT_FORMS}"
        ));
    }
    if let Some(period) = s.strip_prefix("now/") {
        let period = humantime::parse_duration(period)
            .map_err(|e| format!("{s:?}: bad period ({e}); use {SLOT_FORMS}"))?;
        let period = i64::try_from(period.as_millis())
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{s:?}: the period must be at least 1ms"))?;
        return Ok(now_ms - now_ms.rem_euclid(period));
    }
    s.parse::<i64>()
        .map_err(|_| format!("{s:?} is not a slot; use {SLOT_FORMS}"))
}

/// A status's message with its causes: a transport failure says more than
/// `transport error` (connection refused, TLS, deadline, …).
pub fn status_text(st: &Status) -> String {
    crate::error::with_causes(st.message().to_owned(), std::error::Error::source(st))
}

/// Prints a gRPC error (text or JSON) and returns exit status 1.
pub fn print_status(json: bool, st: &Status) -> ExitCode {
    let reason = status_reason(st).unwrap_or_default();
    let message = status_text(st);
    if json {
        println!(
            "{}",
            json!({"error": {"code": format!("{:?}", st.code()), "reason": reason, "message": message}})
        );
    } else {
        eprintln!("anarchon: {:?}: {message}", st.code());
    }
    ExitCode::FAILURE
}

fn fail(json: bool, e: anyhow::Error) -> ExitCode {
    let message = super::anyhow_chain(&e);
    if json {
        println!(
            "{}",
            json!({"error": {"code": "Unavailable", "message": message}})
        );
    } else {
        eprintln!("anarchon: {message}");
    }
    ExitCode::FAILURE
}

/// An outcome's name without its prefix (`WON`), `UNSPECIFIED` if unknown.
pub fn outcome_name(o: i32) -> &'static str {
    pb::Outcome::try_from(o)
        .map(|o| o.as_str_name().trim_start_matches("OUTCOME_"))
        .unwrap_or("UNSPECIFIED")
}

fn state_name(s: i32) -> &'static str {
    match pb::RunState::try_from(s) {
        Ok(pb::RunState::Running) => "RUNNING",
        Ok(pb::RunState::Succeeded) => "SUCCEEDED",
        Ok(pb::RunState::Failed) => "FAILED",
        Ok(pb::RunState::Interrupted) => "INTERRUPTED",
        Ok(pb::RunState::Claimed) => "CLAIMED",
        _ => "UNSPECIFIED",
    }
}

/// Options of a claim, shared by `claim` and `hold`.
///
/// Durations take `1500ms`, `30s`, `2m`, … or bare milliseconds.
#[derive(Debug, Clone, Args)]
pub struct ClaimOpts {
    /// The job name: 1-200 bytes of [A-Za-z0-9._:/-].
    pub job: String,
    /// The slot: epoch milliseconds, or now/PERIOD (now/1m, now/5m, now/1h,
    /// now/1d: this host's clock rounded down to the period). 0 is a lock
    /// not tied to time.
    #[arg(long, default_value = "0", value_parser = parse_slot)]
    pub slot: i64,
    /// Resend with this token (32 hex) instead of a new one.
    #[arg(long)]
    pub token: Option<String>,
    /// Lease of the run (lease backends); renewed by `hold`. At least
    /// 3 x the sidecar's heartbeat [default: the sidecar's lease_ms, 30s].
    #[arg(long, visible_aliases = ["lease", "ttl"], value_name = "DURATION", value_parser = crate::duration::parse_lease_ms)]
    pub lease_ms: Option<i64>,
    /// How late after the slot a run may still start (never for slot 0)
    /// [default: the sidecar's max_late_ms, 60s].
    #[arg(long, visible_alias = "max-late", value_name = "DURATION", value_parser = crate::duration::parse_ms_i64)]
    pub max_late_ms: Option<i64>,
    /// allow or skip: whether the run may start while another run of the job
    /// runs [default: the sidecar's overlap, allow].
    #[arg(long)]
    pub overlap: Option<String>,
    /// Attempts (first run + takeovers) before the run is INTERRUPTED
    /// [default: the sidecar's max_attempts, 3].
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Wait up to this long for a running run to become free (lease
    /// backends) [default: 0, answer at once].
    #[arg(long, visible_alias = "wait", value_name = "DURATION", value_parser = crate::duration::parse_ms_i64)]
    pub wait_ms: Option<i64>,
}

impl ClaimOpts {
    pub fn request(&self) -> Result<pb::ClaimRequest, String> {
        let overlap = match self
            .overlap
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => pb::Overlap::Unspecified,
            Some("allow") => pb::Overlap::Allow,
            Some("skip") => pb::Overlap::Skip,
            Some(o) => return Err(format!("--overlap {o:?}: expected allow or skip")),
        };
        Ok(pb::ClaimRequest {
            job: self.job.clone(),
            slot_ms: self.slot,
            token: self.token.clone().unwrap_or_default(),
            lease_ms: self.lease_ms.unwrap_or(0),
            max_late_ms: self.max_late_ms.unwrap_or(0),
            overlap: overlap as i32,
            max_attempts: self.max_attempts.unwrap_or(0),
            wait_ms: self.wait_ms.unwrap_or(0),
        })
    }
}

pub fn claim_json(r: &pb::ClaimResponse) -> serde_json::Value {
    json!({
        "outcome": outcome_name(r.outcome),
        "token": r.token,
        "attempt": r.attempt,
        "fencing": r.fencing,
        "lease_until_ms": r.lease_until_ms,
        "valid_for_ms": r.valid_for_ms,
        "holder": r.holder.as_ref().map(|h| json!({"node": h.node, "instance": h.instance})),
        "backend": r.backend,
        "reason": r.reason,
    })
}

pub fn claim_text(job: &str, slot: i64, r: &pb::ClaimResponse) -> String {
    let mut s = format!("{} job={job} slot={slot}", outcome_name(r.outcome));
    if r.attempt > 0 {
        s += &format!(" attempt={}", r.attempt);
    }
    if !r.token.is_empty() {
        s += &format!(" fencing={} token={}", r.fencing, r.token);
        // Once backends have no leases: nothing runs out, so no valid_for.
        if r.lease_until_ms > 0 {
            s += &format!(" valid_for={}ms", r.valid_for_ms);
        }
    }
    if let Some(h) = &r.holder {
        s += &format!(" holder={}/{}", h.node, h.instance);
    }
    if !r.reason.is_empty() {
        s += &format!(" reason={}", r.reason);
    }
    s
}

#[derive(Debug, Args)]
pub struct ClaimArgs {
    #[command(flatten)]
    pub claim: ClaimOpts,
    #[command(flatten)]
    pub client: ClientOpts,
}

pub async fn claim(a: ClaimArgs) -> ExitCode {
    let json = a.client.json;
    let req = match a.claim.request() {
        Ok(r) => r,
        Err(e) => return fail(json, anyhow::anyhow!(e)),
    };
    let (mut c, _) = match connect_or_report(&a.client).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match c.claim(req).await {
        Ok(r) => {
            let r = r.into_inner();
            if json {
                println!("{}", claim_json(&r));
            } else {
                println!("{}", claim_text(&a.claim.job, a.claim.slot, &r));
            }
            if r.outcome == pb::Outcome::Won as i32 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_NOT_WON)
            }
        }
        Err(st) => print_status(json, &st),
    }
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    /// The job of the run you hold.
    pub job: String,
    /// The slot of the run you hold: epoch milliseconds, or `now`.
    #[arg(long, value_parser = parse_slot)]
    pub slot: i64,
    /// The token the claim answered (32 hex).
    #[arg(long)]
    pub token: String,
    /// The new lease, from now (`30s`, `2m`, … or bare milliseconds)
    /// [default: the lease the run was claimed with].
    #[arg(long, visible_aliases = ["lease", "ttl"], value_name = "DURATION", value_parser = crate::duration::parse_lease_ms)]
    pub lease_ms: Option<i64>,
    #[command(flatten)]
    pub client: ClientOpts,
}

pub async fn renew(a: RenewArgs) -> ExitCode {
    let json = a.client.json;
    let (mut c, _) = match connect_or_report(&a.client).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let req = pb::RenewRequest {
        job: a.job.clone(),
        slot_ms: a.slot,
        token: a.token,
        lease_ms: a.lease_ms.unwrap_or(0),
    };
    match c.renew(req).await {
        Ok(r) => {
            let r = r.into_inner();
            if json {
                println!(
                    "{}",
                    json!({"lease_until_ms": r.lease_until_ms, "attempt": r.attempt, "valid_for_ms": r.valid_for_ms, "fencing": r.fencing})
                );
            } else {
                println!(
                    "RENEWED job={} slot={} attempt={} valid_for={}ms",
                    a.job, a.slot, r.attempt, r.valid_for_ms
                );
            }
            ExitCode::SUCCESS
        }
        Err(st) => print_status(json, &st),
    }
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The job of the run you hold.
    pub job: String,
    /// The slot of the run you hold: epoch milliseconds, or `now`.
    #[arg(long, value_parser = parse_slot)]
    pub slot: i64,
    /// The token the claim answered (32 hex).
    #[arg(long)]
    pub token: String,
    /// Record the run as FAILED instead of SUCCEEDED.
    #[arg(long)]
    pub failed: bool,
    #[command(flatten)]
    pub client: ClientOpts,
}

pub async fn release(a: ReleaseArgs) -> ExitCode {
    let json = a.client.json;
    let (mut c, _) = match connect_or_report(&a.client).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let result = if a.failed {
        pb::ReleaseResult::Failed
    } else {
        pb::ReleaseResult::Succeeded
    };
    let req = pb::ReleaseRequest {
        job: a.job.clone(),
        slot_ms: a.slot,
        token: a.token,
        result: result as i32,
    };
    match c.release(req).await {
        Ok(_) => {
            let result = if a.failed { "FAILED" } else { "SUCCEEDED" };
            if json {
                println!("{}", json!({"released": true, "result": result}));
            } else {
                println!("RELEASED job={} slot={} result={result}", a.job, a.slot);
            }
            ExitCode::SUCCESS
        }
        Err(st) => print_status(json, &st),
    }
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The job name.
    pub job: String,
    /// How many runs to show, newest first (at most 1000).
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// Only slots before this one (paging).
    #[arg(long)]
    pub before: Option<i64>,
    #[command(flatten)]
    pub client: ClientOpts,
}

pub async fn history(a: HistoryArgs) -> ExitCode {
    let json = a.client.json;
    let (mut c, _) = match connect_or_report(&a.client).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let req = pb::HistoryRequest {
        job: a.job.clone(),
        limit: a.limit,
        before_slot_ms: a.before,
    };
    match c.history(req).await {
        Ok(r) => {
            let r = r.into_inner();
            if json {
                let runs: Vec<_> = r
                    .runs
                    .iter()
                    .map(|x| {
                        json!({
                            "slot_ms": x.slot_ms, "attempt": x.attempt, "state": state_name(x.state),
                            "holder": x.holder.as_ref().map(|h| json!({"node": h.node, "instance": h.instance})),
                            "claimed_at_ms": x.claimed_at_ms, "finished_at_ms": x.finished_at_ms,
                            "lease_until_ms": x.lease_until_ms, "fencing": x.fencing,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    json!({"runs": runs, "backend": r.backend, "retention": r.retention, "complete": r.complete, "note": r.note})
                );
            } else {
                println!(
                    "{:<15} {:>7} {:>7} {:<12} {:<45} {:<24} FINISHED_AT",
                    "SLOT", "ATTEMPT", "FENCING", "STATE", "HOLDER", "CLAIMED_AT"
                );
                for x in &r.runs {
                    let h = x
                        .holder
                        .as_ref()
                        .map(|h| format!("{}/{}", h.node, h.instance))
                        .unwrap_or_default();
                    println!(
                        "{:<15} {:>7} {:>7} {:<12} {:<45} {:<24} {}",
                        x.slot_ms,
                        x.attempt,
                        x.fencing,
                        state_name(x.state),
                        h,
                        rfc3339(x.claimed_at_ms),
                        rfc3339(x.finished_at_ms)
                    );
                }
                println!("# backend {}: {}", r.backend, r.retention);
                if !r.note.is_empty() {
                    println!("# {}", r.note);
                }
            }
            ExitCode::SUCCESS
        }
        Err(st) => print_status(json, &st),
    }
}

/// Epoch milliseconds as RFC 3339 (UTC, milliseconds); `-` for 0 (not yet).
pub fn rfc3339(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

#[derive(Debug, Args)]
pub struct PeersArgs {
    #[command(flatten)]
    pub client: ClientOpts,
}

pub async fn peers(a: PeersArgs) -> ExitCode {
    let json = a.client.json;
    let (_, mut m) = match connect_or_report(&a.client).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match m.list_peers(pb::ListPeersRequest {}).await {
        Ok(r) => {
            let r = r.into_inner();
            let all: Vec<&pb::Peer> = r.self_.iter().chain(r.peers.iter()).collect();
            if json {
                let v: Vec<_> = all.iter().map(|p| peer_json(p)).collect();
                let refused: Vec<_> = r
                    .refused
                    .iter()
                    .map(|x| {
                        json!({"node": x.node, "address": x.address, "reason": x.reason,
                               "store_identity": x.store_identity, "age_ms": x.age_ms})
                    })
                    .collect();
                println!(
                    "{}",
                    json!({"peers": v, "refused": refused, "store_identity": r.store_identity,
                           "duplicate_node_key": r.duplicate_node_key,
                           "duplicate_instance": r.duplicate_instance})
                );
            } else {
                println!(
                    "{:<34} {:>8} {:>8} {:<12} {:<8} {:>12} ADDRESS",
                    "NODE", "INSTANCE", "RESTARTS", "STATE", "LINK", "BEAT"
                );
                for (i, p) in all.into_iter().enumerate() {
                    let state = peer_state_name(p.state);
                    let link = if i == 0 { "SELF" } else { link_name(p.link) };
                    // A configured peer that never answered: no node yet,
                    // and why it is unreachable.
                    let (node, beat, error) = if p.node.is_empty() {
                        let e = p.labels.get("last_error").cloned().unwrap_or_default();
                        ("-".to_owned(), "never".to_owned(), format!(" ({e})"))
                    } else {
                        (
                            p.node.clone(),
                            format!("{:.1}s ago", p.beat_age_ms as f64 / 1000.0),
                            String::new(),
                        )
                    };
                    println!(
                        "{:<34} {:>8} {:>8} {:<12} {:<8} {:>12} {}{error}",
                        node, p.instance, p.restarts, state, link, beat, p.address
                    );
                }
                for x in &r.refused {
                    println!(
                        "{:<34} {:>8} {:>8} {:<12} {:<8} {:>12} {}",
                        x.node,
                        "-",
                        "-",
                        "REFUSED",
                        "NONE",
                        format!("{:.1}s ago", x.age_ms as f64 / 1000.0),
                        x.address
                    );
                }
                for x in &r.refused {
                    println!(
                        "refused {} ({}): {}: it claims in store {}, this sidecar in store {}",
                        x.node, x.address, x.reason, x.store_identity, r.store_identity
                    );
                }
                if r.duplicate_node_key {
                    println!(
                        "duplicate node key: another live process runs with this sidecar's node \
                         key (instance {}; a shared data dir or a copied node.key): stop one of them",
                        r.duplicate_instance
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(st) => print_status(json, &st),
    }
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Include expired and left runtimes in the first snapshot.
    #[arg(long)]
    pub include_expired: bool,
    #[command(flatten)]
    pub client: ClientOpts,
}

/// A runtime as `peers --json` and `watch --json` print it: the mesh's
/// [`peer_json`](crate::server::mesh_state::peer_json) with the last dial error in
/// place of the labels.
fn peer_json(p: &pb::Peer) -> serde_json::Value {
    let mut v = crate::server::mesh_state::peer_json(p);
    if let Some(o) = v.as_object_mut() {
        o.remove("labels");
        o.insert("last_error".into(), json!(p.labels.get("last_error")));
    }
    v
}

/// Streams peer events until interrupted: one line (or JSON object) each.
pub async fn watch(a: WatchArgs) -> ExitCode {
    let json = a.client.json;
    let (_, mut m) = match connect_or_report(&a.client).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut stream = match m
        .watch_peers(pb::WatchPeersRequest {
            include_expired: a.include_expired,
        })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(st) => return print_status(json, &st),
    };
    loop {
        match stream.message().await {
            Ok(Some(ev)) => {
                let kind = pb::PeerEventKind::try_from(ev.kind)
                    .map(|k| k.as_str_name().trim_start_matches("PEER_EVENT_KIND_"))
                    .unwrap_or("?");
                let p = ev.peer.unwrap_or_default();
                if json {
                    println!("{}", json!({"event": kind, "peer": peer_json(&p)}));
                } else {
                    let state = peer_state_name(p.state);
                    println!(
                        "{kind:<11} {} instance={} restarts={} state={state} beat={} address={}",
                        p.node, p.instance, p.restarts, p.beat, p.address
                    );
                }
            }
            Ok(None) => return ExitCode::SUCCESS,
            Err(st) => return print_status(json, &st),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::slot_at;

    #[test]
    fn now_rounds_down_to_the_period() {
        let t = 1_796_000_123_456; // 2026-11-30T00:55:23.456Z
        assert_eq!(slot_at("now/1m", t), Ok(1_796_000_100_000));
        assert_eq!(slot_at("now/5m", t), Ok(1_796_000_100_000));
        assert_eq!(slot_at("now/1h", t), Ok(1_795_996_800_000));
        assert_eq!(slot_at("now/1d", t), Ok(1_795_996_800_000));
        assert_eq!(slot_at("now/1s", t), Ok(1_796_000_123_000));
        // Two claims a few ms apart name the same slot.
        assert_eq!(slot_at("now/1m", t), slot_at("now/1m", t + 7));
        assert_eq!(slot_at("1796000000000", t), Ok(1_796_000_000_000));
    }

    #[test]
    fn bare_now_and_bad_periods_are_refused_naming_the_forms() {
        let e = slot_at("now", 5).unwrap_err();
        assert!(e.contains("now/1m") && e.contains("now/1d"), "{e}");
        assert!(slot_at("now/0s", 5).unwrap_err().contains("at least 1ms"));
        assert!(slot_at("now/xyz", 5).unwrap_err().contains("now/5m"));
        assert!(slot_at("soon", 5).unwrap_err().contains("now/1h"));
    }
}
