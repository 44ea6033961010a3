//! Tracing setup: one span per RPC with `job`, `slot` and `outcome`; plain or
//! JSON lines on stderr; `RUST_LOG` filters (default `info`).

use tracing_subscriber::{fmt, EnvFilter};

/// Installs the global subscriber. Calling it twice is harmless.
pub fn init(format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
