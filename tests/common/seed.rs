//! The one seeded generator for randomized tests. The seed comes from
//! `ANARCHON_SEED` (to replay a failure) or else from the clock; a test
//! that fails prints the seed it ran with.

use rand::rngs::StdRng;
use rand::SeedableRng;

/// The environment variable that fixes the seed.
pub const SEED_ENV: &str = "ANARCHON_SEED";

/// Prints the seed when dropped during a panic (keep it alive for the
/// whole test: `let (mut rng, _seed) = seed::rng("name");`).
pub struct SeedGuard {
    test: &'static str,
    seed: u64,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{} failed with seed {}: replay with {SEED_ENV}={}",
                self.test, self.seed, self.seed
            );
        }
    }
}

/// The seed: `ANARCHON_SEED` when set, else the clock's nanoseconds.
pub fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{SEED_ENV}={v:?} is not a u64: {e}")),
        _ => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default(),
    }
}

/// A generator for `test`, seeded by [`seed`], and the guard that prints
/// the seed if the test fails.
pub fn rng(test: &'static str) -> (StdRng, SeedGuard) {
    let seed = seed();
    eprintln!("{test}: seed {seed} ({SEED_ENV} replays it)");
    (StdRng::seed_from_u64(seed), SeedGuard { test, seed })
}
