//! TLS on the gRPC listener (rustls through tonic). With `tls_client_ca`,
//! clients must present a certificate signed by that CA (mTLS), and peers
//! are dialed over TLS, checked against the same CA, presenting our own
//! certificate.

use anyhow::Context;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::Config;

pub struct Tls {
    pub server: ServerTlsConfig,
    pub peer_client: ClientTlsConfig,
}

fn read(key: &str, p: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(p).with_context(|| format!("cannot read {key} {}", p.display()))
}

/// Several dependencies enable different rustls backends, so rustls cannot
/// pick one by itself: install `ring` as the process default. Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `None` when TLS is off.
pub fn load(cfg: &Config) -> anyhow::Result<Option<Tls>> {
    install_crypto_provider();
    let (Some(cert), Some(key)) = (&cfg.tls_cert, &cfg.tls_key) else {
        return Ok(None);
    };
    let identity = Identity::from_pem(read("tls_cert", cert)?, read("tls_key", key)?);
    let mut server = ServerTlsConfig::new().identity(identity.clone());
    let mut peer_client = ClientTlsConfig::new().identity(identity);
    if let Some(ca) = &cfg.tls_client_ca {
        let ca = Certificate::from_pem(read("tls_client_ca", ca)?);
        server = server.client_ca_root(ca.clone());
        peer_client = peer_client.ca_certificate(ca);
    }
    Ok(Some(Tls {
        server,
        peer_client,
    }))
}
