//! Which real services are reachable. Outside CI a missing service skips its
//! suite with a clear line on stderr; with `CI=true` it is a failure.

use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

pub fn reachable(addr: &str) -> bool {
    addr.parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).ok())
        .is_some()
}

pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// Returns true when the service at `addr` can be used; false (after saying
/// so) when the suite must be skipped. Panics under CI=true.
pub fn require(name: &str, addr: &str) -> bool {
    usable(name, addr, reachable(addr))
}

/// [`require`] for a service on a Unix socket at `path`.
pub fn require_unix(name: &str, path: &str) -> bool {
    usable(name, path, UnixStream::connect(path).is_ok())
}

fn usable(name: &str, at: &str, up: bool) -> bool {
    if up {
        return true;
    }
    if in_ci() {
        panic!("{name} at {at} is not reachable, and CI=true forbids skipping its suite");
    }
    eprintln!("SKIPPED {name} suite: {at} is not reachable (start it, or run scripts/test.sh)");
    false
}
