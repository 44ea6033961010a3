//! Signed marks and hellos: the canonical bytes, signing and verification.
//!
//! A mark says "runtime `node`/`instance` reached `beat`" (and whether it
//! left), signed with the node's Ed25519 key. Relays forward marks verbatim,
//! so they cannot mint beats. A node id must hash from the key it carries.

use ed25519_dalek::{Signature, VerifyingKey};

use super::identity::{node_id, Identity};
use crate::proto as pb;

/// Why a mark or hello was refused. Every drop is counted by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The signature does not verify.
    BadSignature,
    /// The public key does not hash to the node id.
    KeyMismatch,
    /// Field sizes are wrong (key, signature, node id, label sizes).
    Malformed,
    /// A mark about this runtime itself, sent by someone else.
    AboutSelf,
    /// An older instance than the one known.
    StaleInstance,
    /// Not newer than what is known (same instance, beat not higher).
    NotNewer,
    /// A frame carried more runtimes than allowed.
    TooManyRuntimes,
    /// A frame was larger than allowed.
    FrameTooLarge,
    /// The hello did not present the mesh secret.
    BadSecret,
    /// The hello's proof of key does not verify.
    BadProof,
    /// The first frame of a link was not a hello.
    NoHello,
    /// A runtime opened more links than allowed.
    TooManyLinks,
    /// A runtime claims in another store than ours.
    StoreMismatch,
    /// A mark sent without its identity, about a runtime we do not know.
    UnknownIdentity,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::BadSignature => "bad_signature",
            Refusal::KeyMismatch => "key_mismatch",
            Refusal::Malformed => "malformed",
            Refusal::AboutSelf => "about_self",
            Refusal::StaleInstance => "stale_instance",
            Refusal::NotNewer => "not_newer",
            Refusal::TooManyRuntimes => "too_many_runtimes",
            Refusal::FrameTooLarge => "frame_too_large",
            Refusal::BadSecret => "bad_secret",
            Refusal::BadProof => "bad_proof",
            Refusal::NoHello => "no_hello",
            Refusal::TooManyLinks => "too_many_links",
            Refusal::StoreMismatch => "store_mismatch",
            Refusal::UnknownIdentity => "unknown_identity",
        }
    }

    /// Whether this drop signals something wrong (as opposed to ordinary
    /// duplicates that relays produce all the time).
    pub fn is_suspicious(self) -> bool {
        !matches!(
            self,
            Refusal::NotNewer
                | Refusal::StaleInstance
                | Refusal::AboutSelf
                | Refusal::UnknownIdentity
        )
    }
}

pub const MAX_LABELS: usize = 32;
pub const MAX_LABEL_BYTES: usize = 256;
pub const MAX_ADDRESS_BYTES: usize = 256;

fn mark_bytes(node: &str, instance: u64, beat: u64, left: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(b"anarchon/mark/v1\0");
    b.extend_from_slice(&(node.len() as u32).to_be_bytes());
    b.extend_from_slice(node.as_bytes());
    b.extend_from_slice(&instance.to_be_bytes());
    b.extend_from_slice(&beat.to_be_bytes());
    b.push(u8::from(left));
    b
}

fn hello_bytes(node: &str, instance: u64, nonce: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(80);
    b.extend_from_slice(b"anarchon/hello/v1\0");
    b.extend_from_slice(&(node.len() as u32).to_be_bytes());
    b.extend_from_slice(node.as_bytes());
    b.extend_from_slice(&instance.to_be_bytes());
    b.extend_from_slice(nonce);
    b
}

/// This runtime's signed mark for `beat`.
pub fn sign_mark(
    id: &Identity,
    beat: u64,
    left: bool,
    address: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> pb::Mark {
    pb::Mark {
        node: id.node.clone(),
        instance: id.instance,
        beat,
        signature: id.sign(&mark_bytes(&id.node, id.instance, beat, left)),
        public_key: id.public_key().as_bytes().to_vec(),
        address: address.to_owned(),
        labels: labels.clone().into_iter().collect(),
        age_ms: 0,
        left,
    }
}

/// This runtime's hello with a fresh nonce.
pub fn sign_hello(id: &Identity, address: &str, secret: Option<&str>) -> pb::Hello {
    let nonce: [u8; 16] = rand::random();
    pb::Hello {
        node: id.node.clone(),
        instance: id.instance,
        public_key: id.public_key().as_bytes().to_vec(),
        proof: id.sign(&hello_bytes(&id.node, id.instance, &nonce)),
        nonce: nonce.to_vec(),
        address: address.to_owned(),
        mesh_secret: secret.unwrap_or_default().to_owned(),
        store_identity: String::new(),
        gossip: super::gossip::GOSSIP_TREES,
    }
}

fn key_for(node: &str, public_key: &[u8]) -> Result<VerifyingKey, Refusal> {
    let bytes: [u8; 32] = public_key.try_into().map_err(|_| Refusal::Malformed)?;
    let key = VerifyingKey::from_bytes(&bytes).map_err(|_| Refusal::Malformed)?;
    // A small-order key could "sign" anything under a cofactored check (the
    // batch): refused outright, as `verify_strict` would.
    if key.is_weak() {
        return Err(Refusal::Malformed);
    }
    if node_id(&key) != node {
        return Err(Refusal::KeyMismatch);
    }
    Ok(key)
}

fn check(key: &VerifyingKey, msg: &[u8], sig: &[u8], bad: Refusal) -> Result<(), Refusal> {
    let sig: [u8; 64] = sig.try_into().map_err(|_| Refusal::Malformed)?;
    key.verify_strict(msg, &Signature::from_bytes(&sig))
        .map_err(|_| bad)
}

/// Checks sizes, that the key hashes to the node and the signature verifies.
pub fn verify_mark(m: &pb::Mark) -> Result<(), Refusal> {
    verify_mark_keyed(m).map(|_| ())
}

/// [`verify_mark`], returning the key it verified with, for the caller to
/// keep (see [`prepare_mark`]).
pub fn verify_mark_keyed(m: &pb::Mark) -> Result<VerifyingKey, Refusal> {
    let p = prepare_mark(m, None)?;
    p.key
        .verify_strict(&p.msg, &p.signature)
        .map_err(|_| Refusal::BadSignature)?;
    Ok(p.key)
}

/// A mark ready for its signature check: everything but the check done.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub key: VerifyingKey,
    msg: Vec<u8>,
    signature: Signature,
}

/// Checks sizes and the key (decoded, not weak, hashing to the node; or the
/// `known` one, already proven for this node, if the mark carries it: that
/// skips decoding and hashing it, about a fifth of a check), and builds the
/// signed bytes.
pub fn prepare_mark(m: &pb::Mark, known: Option<&VerifyingKey>) -> Result<Prepared, Refusal> {
    if m.node.len() != 32
        || m.address.len() > MAX_ADDRESS_BYTES
        || m.labels.len() > MAX_LABELS
        || m.labels
            .iter()
            .any(|(k, v)| k.len() + v.len() > MAX_LABEL_BYTES)
    {
        return Err(Refusal::Malformed);
    }
    let key = match known {
        Some(k) if k.as_bytes().as_slice() == m.public_key.as_slice() => *k,
        _ => key_for(&m.node, &m.public_key)?,
    };
    let signature: [u8; 64] = m
        .signature
        .as_slice()
        .try_into()
        .map_err(|_| Refusal::Malformed)?;
    Ok(Prepared {
        key,
        msg: mark_bytes(&m.node, m.instance, m.beat, m.left),
        signature: Signature::from_bytes(&signature),
    })
}

/// Checks many prepared marks' signatures: in one batch (Ed25519 batch
/// verification: about half the CPU of checking each, for the tens of
/// marks a relay frame brings), and each on its own (`verify_strict`) only
/// if the batch fails, to tell which. Keys are never weak (see `key_for`),
/// so the batch's cofactored equation accepts no signature a forger could
/// make; it may accept a malleated form of a signature the key's owner
/// made, which proves the same beat.
pub fn verify_prepared(marks: &[Prepared]) -> Vec<bool> {
    if marks.len() >= 2 {
        let msgs: Vec<&[u8]> = marks.iter().map(|p| p.msg.as_slice()).collect();
        let sigs: Vec<Signature> = marks.iter().map(|p| p.signature).collect();
        let keys: Vec<VerifyingKey> = marks.iter().map(|p| p.key).collect();
        if ed25519_dalek::verify_batch(&msgs, &sigs, &keys).is_ok() {
            return vec![true; marks.len()];
        }
    }
    marks
        .iter()
        .map(|p| p.key.verify_strict(&p.msg, &p.signature).is_ok())
        .collect()
}

/// Checks a hello's proof of key and, if one is required, its mesh secret.
pub fn verify_hello(h: &pb::Hello, secret: Option<&str>) -> Result<(), Refusal> {
    if let Some(want) = secret {
        if !constant_time_eq(want.as_bytes(), h.mesh_secret.as_bytes()) {
            return Err(Refusal::BadSecret);
        }
    }
    if h.node.len() != 32 || h.nonce.len() > 64 || h.address.len() > MAX_ADDRESS_BYTES {
        return Err(Refusal::Malformed);
    }
    let key = key_for(&h.node, &h.public_key)?;
    check(
        &key,
        &hello_bytes(&h.node, h.instance, &h.nonce),
        &h.proof,
        Refusal::BadProof,
    )
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_verify_and_forgeries_do_not() {
        let id = Identity::ephemeral(3);
        let m = sign_mark(&id, 7, false, "127.0.0.1:1", &Default::default());
        assert_eq!(verify_mark(&m), Ok(()));
        let mut beat = m.clone();
        beat.beat = 8;
        assert_eq!(verify_mark(&beat), Err(Refusal::BadSignature));
        let mut left = m.clone();
        left.left = true;
        assert_eq!(verify_mark(&left), Err(Refusal::BadSignature));
        let other = Identity::ephemeral(3);
        let mut key = m.clone();
        key.public_key = other.public_key().as_bytes().to_vec();
        assert_eq!(verify_mark(&key), Err(Refusal::KeyMismatch));
        let mut short = m.clone();
        short.signature.truncate(10);
        assert_eq!(verify_mark(&short), Err(Refusal::Malformed));
        // The address and age are not signed: relays set age, and an address
        // change cannot revive anything.
        let mut relayed = m;
        relayed.age_ms = 999;
        assert_eq!(verify_mark(&relayed), Ok(()));
    }

    #[test]
    fn hellos_prove_the_key_and_the_secret() {
        let id = Identity::ephemeral(1);
        let h = sign_hello(&id, "a:1", Some("s3cret"));
        assert_eq!(verify_hello(&h, Some("s3cret")), Ok(()));
        assert_eq!(verify_hello(&h, None), Ok(()));
        assert_eq!(verify_hello(&h, Some("other")), Err(Refusal::BadSecret));
        let mut forged = h.clone();
        forged.instance = 2;
        assert_eq!(verify_hello(&forged, None), Err(Refusal::BadProof));
    }
}
