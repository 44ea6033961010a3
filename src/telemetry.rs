//! Tracing setup: one span per RPC with `job`, `slot` and `outcome`; plain or
//! JSON lines on stderr; `RUST_LOG` filters (default `info`). Plain lines are
//! coloured only when stderr is a terminal and `NO_COLOR` is not set
//! (<https://no-color.org>), so logs written to a file carry no escape codes.

use std::io::IsTerminal;

use tracing_subscriber::{fmt, EnvFilter};

/// Installs the global subscriber. Calling it twice is harmless.
pub fn init(format: crate::config::LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(use_colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ));
    let _ = if format == crate::config::LogFormat::Json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// Colour only on a terminal, and not when `NO_COLOR` is set to anything
/// but the empty string.
pub fn use_colour(is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some("".into())));
        assert!(!use_colour(true, Some("1".into())));
        assert!(!use_colour(false, None));
    }
}
