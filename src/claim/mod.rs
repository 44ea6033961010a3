//! The claim domain: validated inputs, runs, outcomes and the lease decision
//! table ([`decide`]). Nothing here does I/O.

mod decide;
mod types;

pub use decide::{
    decide, decide_release, decide_renew, excludes, wrong_token, Decision, ReleaseDecision,
};
pub use types::*;
