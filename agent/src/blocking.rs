//! Long copies on blocking threads, with progress and cancellation: how
//! dataset copies and hydration move their bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Runs `work` on a blocking thread, reporting `done` of `total` every half
/// second. `work` polls `stop`, which the cell's cancellation sets, and so
/// does dropping this future. Copies and hydration (`hydrate::read_all`)
/// move their bytes this way.
pub async fn with_progress<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
    done: &AtomicU64,
    stop: &Arc<AtomicBool>,
    total: u64,
    mut progress: impl FnMut(u64, u64),
    cancel: &CancellationToken,
) -> std::result::Result<T, tokio::task::JoinError> {
    /// Stops the blocking threads when the cell's future is dropped.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _guard = StopOnDrop(stop.clone());
    let task = tokio::task::spawn_blocking(work);
    tokio::pin!(task);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            r = &mut task => return r,
            _ = tick.tick() => progress(done.load(Ordering::Relaxed), total),
            _ = cancel.cancelled(), if !stop.load(Ordering::Relaxed) => stop.store(true, Ordering::Relaxed),
        }
    }
}
