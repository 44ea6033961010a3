//! Node identity: an Ed25519 key in `<data_dir>/node.key`, and an instance
//! generation in `<data_dir>/instance` that strictly increases at every start.
//!
//! `node` is the first 32 hex characters of SHA-256 of the public key. The key
//! file is written once (temp file, fsync, rename, mode 0600); a malformed key
//! file is an error and is never replaced. The instance counter is bumped and
//! synced to disk under an exclusive file lock before anything is served, so
//! two starts never share an instance.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

const KEY_FILE: &str = "node.key";
const INSTANCE_FILE: &str = "instance";
const KEY_HEADER: &str = "anarchon-node-key-v1";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is malformed ({why}); refusing to replace it — move it away to make a new node"
    )]
    Malformed { path: PathBuf, why: String },
    /// Another live process holds the data dir's lock.
    #[error("data dir {} is in use by pid {pid}", dir.display())]
    InUse { dir: PathBuf, pid: String },
}

const LOCK_FILE: &str = "serve.lock";

/// An exclusive `flock` on `<data_dir>/serve.lock`, held for the life of a
/// `serve` process, so that two processes never run as the same node (the
/// second would bump the instance and make the peers treat the live first
/// one as superseded). The file holds the pid of the owner. The kernel drops
/// the lock when the process dies, however it dies.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock without waiting; [`IdentityError::InUse`] names the pid
    /// of the process holding it.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, IdentityError> {
        fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        let path = data_dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let pid = fs::read_to_string(&path).unwrap_or_default();
                let pid = match pid.trim() {
                    "" => "unknown".to_owned(),
                    p => p.to_owned(),
                };
                return Err(IdentityError::InUse {
                    dir: data_dir.to_owned(),
                    pid,
                });
            }
            Err(fs::TryLockError::Error(e)) => return Err(io(&path)(e)),
        }
        file.set_len(0).map_err(io(&path))?;
        file.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io(&path))?;
        file.sync_all().map_err(io(&path))?;
        Ok(DataDirLock { _file: file })
    }
}

pub struct Identity {
    key: SigningKey,
    /// Stable node id: first 32 hex of SHA-256 of the public key.
    pub node: String,
    /// The generation of this process start.
    pub instance: u64,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("node", &self.node)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// The node id of a public key.
pub fn node_id(public: &VerifyingKey) -> String {
    let digest = Sha256::digest(public.as_bytes());
    hex::encode(&digest[..16])
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `contents` to `path` atomically: temp file, fsync, rename, fsync dir.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), IdentityError> {
    let tmp = path.with_extension("tmp");
    {
        let mut opts = OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(mode);
        }
        let mut f = opts.open(&tmp).map_err(io(&tmp))?;
        f.write_all(contents).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    fs::rename(&tmp, path).map_err(io(path))?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

impl Identity {
    /// Loads (or creates) the node key and bumps the instance generation.
    pub fn load_or_create(data_dir: &Path) -> Result<Identity, IdentityError> {
        fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        let key = load_or_create_key(&data_dir.join(KEY_FILE))?;
        let instance = bump_instance(data_dir)?;
        Ok(Identity {
            node: node_id(&key.verifying_key()),
            key,
            instance,
        })
    }

    /// An identity that lives only in memory (tests, benchmarks).
    pub fn ephemeral(instance: u64) -> Identity {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        Identity {
            node: node_id(&key.verifying_key()),
            key,
            instance,
        }
    }

    /// A deterministic identity from a seed (fuzzing, simulations).
    pub fn from_seed(seed: [u8; 32], instance: u64) -> Identity {
        let key = SigningKey::from_bytes(&seed);
        Identity {
            node: node_id(&key.verifying_key()),
            key,
            instance,
        }
    }

    pub fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        self.key.sign(msg).to_bytes().to_vec()
    }

    pub fn holder(&self) -> crate::claim::Holder {
        crate::claim::Holder {
            node: self.node.clone(),
            instance: self.instance,
        }
    }
}

fn load_or_create_key(path: &Path) -> Result<SigningKey, IdentityError> {
    match fs::read_to_string(path) {
        Ok(text) => parse_key(&text).map_err(|why| IdentityError::Malformed {
            path: path.to_owned(),
            why,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = SigningKey::generate(&mut rand::rngs::OsRng);
            let text = format!("{KEY_HEADER} {}\n", hex::encode(key.to_bytes()));
            write_atomic(path, text.as_bytes(), 0o600)?;
            Ok(key)
        }
        Err(e) => Err(io(path)(e)),
    }
}

fn parse_key(text: &str) -> Result<SigningKey, String> {
    let rest = text
        .trim()
        .strip_prefix(KEY_HEADER)
        .ok_or_else(|| format!("does not start with {KEY_HEADER:?}"))?;
    let bytes = hex::decode(rest.trim()).map_err(|e| format!("bad hex: {e}"))?;
    let seed: [u8; 32] = bytes
        .try_into()
        .map_err(|_| "the key is not 32 bytes".to_string())?;
    Ok(SigningKey::from_bytes(&seed))
}

fn bump_instance(data_dir: &Path) -> Result<u64, IdentityError> {
    let lock_path = data_dir.join("instance.lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    lock.lock().map_err(io(&lock_path))?;
    let path = data_dir.join(INSTANCE_FILE);
    let prev = match fs::read_to_string(&path) {
        Ok(t) => t
            .trim()
            .parse::<u64>()
            .map_err(|e| IdentityError::Malformed {
                path: path.clone(),
                why: e.to_string(),
            })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io(&path)(e)),
    };
    let next = prev + 1;
    write_atomic(&path, format!("{next}\n").as_bytes(), 0o644)?;
    drop(lock);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_stable_and_instance_rises() {
        let dir = tempfile::tempdir().unwrap();
        let a = Identity::load_or_create(dir.path()).unwrap();
        let b = Identity::load_or_create(dir.path()).unwrap();
        assert_eq!(a.node, b.node);
        assert_eq!(a.node.len(), 32);
        assert_eq!((a.instance, b.instance), (1, 2));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_second_data_dir_lock_is_refused_with_the_owner_pid() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let e = DataDirLock::acquire(dir.path()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "data dir {} is in use by pid {}",
                dir.path().display(),
                std::process::id()
            )
        );
        drop(first);
        DataDirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn malformed_key_is_an_error_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(KEY_FILE), "garbage").unwrap();
        let e = Identity::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(e, IdentityError::Malformed { .. }), "{e}");
        assert_eq!(
            fs::read_to_string(dir.path().join(KEY_FILE)).unwrap(),
            "garbage"
        );
    }
}
