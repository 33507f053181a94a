//! Failure on purpose, for the tests that prove every failure path of a
//! cell leaves nothing behind (`tests/leaks.rs`): a named step returns an
//! error where it would have succeeded. Armed by `set` in-process or by
//! `PGFLEET_FAILPOINT=<step>` in the agent's environment (read once);
//! never armed otherwise, and an armed step costs a lock only.

use std::sync::Mutex;

use crate::{Error, Result};

/// The steps that can be failed, in a cell's order: a volume attached,
/// then mounted (both inside `Volume::create`: the cell goes on without a
/// volume of its own), the emulated caps set on it, initdb done, the
/// server started, the load begun, the sampler running, a fault injected.
pub const STEPS: &[&str] = &[
    "volume", "mount", "caps", "initdb", "start", "load", "sampler", "fault",
];

static ARMED: Mutex<Option<Option<String>>> = Mutex::new(None);

/// Arms `step` (None: disarms) for this process.
pub fn set(step: Option<&str>) {
    *ARMED.lock().unwrap_or_else(|e| e.into_inner()) = Some(step.map(str::to_string));
}

/// Err when `step` is armed.
pub fn hit(step: &str) -> Result<()> {
    let mut armed = ARMED.lock().unwrap_or_else(|e| e.into_inner());
    let armed = armed.get_or_insert_with(|| std::env::var("PGFLEET_FAILPOINT").ok());
    if armed.as_deref() == Some(step) {
        return Err(Error::Provision(format!(
            "failpoint `{step}` (PGFLEET_FAILPOINT)"
        )));
    }
    Ok(())
}
