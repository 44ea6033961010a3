//! How the bench's clients reach a server (the sidecar or etcd), by
//! `--transport`: loopback TCP, or a Unix socket. Both the sidecar's clients
//! and etcd's use one plain tonic channel per client over the same
//! transport, so the comparison differs only in the server.

use std::net::SocketAddr;
use std::path::PathBuf;

use tonic::transport::{Channel, Endpoint};

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Tcp,
    Unix,
}

impl Transport {
    /// The flag's value, for the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Unix => "unix",
        }
    }
}

/// Where a server answers.
#[derive(Debug, Clone)]
pub enum Target {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Target {
    /// One connection (a plain channel: no balancer, no reconnecting pool).
    pub async fn channel(&self) -> Result<Channel, tonic::transport::Error> {
        match self {
            Target::Tcp(addr) => {
                Endpoint::from_shared(format!("http://{addr}"))?
                    .connect()
                    .await
            }
            Target::Unix(path) => {
                // The sidecar's own client connector (`--server unix:PATH`).
                crate::cli::client::unix_channel(path.clone()).await
            }
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp(a) => write!(f, "{a}"),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}
