//! Shared test support: store factories, the conformance suite, service
//! checks and real-process helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod brokers;
pub mod contest;
pub mod fake_peer;
pub mod inproc;
pub mod lab;
pub mod liveness;
pub mod mesh;
pub mod pg;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod restart;
pub mod seed;
pub mod services;
pub mod soak;
pub mod suite;

use anarchon::claim::*;

/// A job name unique to this test run.
pub fn job(prefix: &str) -> Job {
    let r: u32 = rand::random();
    Job::parse(&format!("{prefix}-{r:08x}")).unwrap()
}

pub fn holder(node: &str, instance: u64) -> Holder {
    Holder {
        node: node.into(),
        instance,
    }
}

pub fn spec(job: &Job, slot_ms: i64, h: &Holder) -> ClaimSpec {
    ClaimSpec {
        job: job.clone(),
        slot_ms,
        token: Token::generate(),
        holder: h.clone(),
        lease_ms: 30_000,
        max_late_ms: 60_000,
        overlap: Overlap::Allow,
        max_attempts: 3,
    }
}

/// A Claims client on the plaintext gRPC port at `addr`.
pub async fn claims_client(
    addr: std::net::SocketAddr,
) -> anarchon::proto::claims_client::ClaimsClient<tonic::transport::Channel> {
    anarchon::proto::claims_client::ClaimsClient::new(
        tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
}

/// Waits until a lease that ends at `lease_until_ms` (on the host clock,
/// which is the SQLite store's clock) has lapsed. A lapse is time passing,
/// so this sleeps exactly until then: no margin to guess.
pub async fn until_lapsed(lease_until_ms: i64) {
    let left = lease_until_ms + 1 - host_now_ms();
    if left > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(left as u64)).await;
    }
}

/// Like [`http_get`] with extra request header lines (`Name: value`);
/// returns the response head and body.
pub async fn http_get_with(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[&str],
) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.to_owned(), body.to_owned())
}

/// A tiny HTTP/1.1 GET over a raw socket (no HTTP client dependency); returns
/// the body. `token` adds a bearer token.
pub async fn http_get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}
