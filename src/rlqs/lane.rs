//! The thread RLQS reports are read on: decoding a report and working through its buckets
//! happen there, away from the runtime that answers `ShouldRateLimit`, so a flood of reports
//! (paced, see `pace`) takes its share of the CPU from the operating system's scheduler, never
//! a turn of a worker that a decision waits behind.

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// A thread with a runtime of its own, running until dropped.
pub struct Lane {
    handle: Handle,
    stop: CancellationToken,
}

impl Lane {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("sluice-rlqs".into())
            .spawn(move || runtime.block_on(stopped.cancelled()))?;
        Ok(Self { handle, stop })
    }

    /// Where to spawn the work.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }
}

impl Drop for Lane {
    /// Ends the thread; the tasks still on it are dropped.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
