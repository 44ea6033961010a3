//! Application authentication: with `--auth-token-file`, every application
//! call (Claims, WatchPeers, ListPeers) must carry
//! `authorization: Bearer <token>`. Peer links (`Sync`) are admitted by the
//! mesh secret and proof of key instead; health checks stay open.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

#[derive(Clone, Default)]
pub struct Auth(Option<Arc<String>>);

impl Auth {
    /// `token` is the shared secret (already trimmed); `None` = no auth.
    pub fn new(token: Option<String>) -> Auth {
        Auth(token.map(|t| Arc::new(format!("Bearer {t}"))))
    }

    pub fn check(&self, md: &MetadataMap) -> Result<(), Status> {
        let Some(want) = &self.0 else { return Ok(()) };
        let got = md
            .get("authorization")
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if bool::from(got.ct_eq(want.as_bytes())) {
            Ok(())
        } else {
            Err(crate::Error::Unauthenticated.into())
        }
    }
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.check(req.metadata())?;
        Ok(req)
    }
}

/// Reads a secret file (trimmed); the error names the key, never the content.
pub fn read_secret(key: &str, path: &std::path::Path) -> anyhow::Result<String> {
    let s = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {key} {}: {e}", path.display()))?;
    let s = s.trim().to_owned();
    if s.is_empty() {
        anyhow::bail!("{key} {} is empty", path.display());
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        let a = Auth::new(Some("s3cret".into()));
        let mut md = MetadataMap::new();
        assert!(a.check(&md).is_err());
        md.insert("authorization", "Bearer nope".parse().unwrap());
        assert_eq!(
            a.check(&md).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        md.insert("authorization", "Bearer s3cret".parse().unwrap());
        assert!(a.check(&md).is_ok());
        assert!(Auth::new(None).check(&MetadataMap::new()).is_ok());
    }
}
