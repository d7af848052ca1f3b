//! Tasks that end with their owner. A task spawned with [`spawn`] is
//! aborted when its handle is dropped, so nothing a pass or a drain
//! started outlives it: a replica that loses leadership drops its
//! controller, and with it every removal, wait and status write the
//! controller had under way (it stands for the lock again; see
//! `controller::leader::Elector::lead`).

use std::future::Future;

use tokio::task::{JoinError, JoinHandle};

/// A spawned task, aborted when dropped.
#[must_use = "dropping the handle aborts the task"]
pub struct Owned<T>(JoinHandle<T>);

/// Spawns `future` on the runtime as a task owned by the returned handle,
/// in the current span (a drain's removals log with their maintenance).
pub fn spawn<F>(future: F) -> Owned<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    use tracing::Instrument;
    Owned(tokio::spawn(future.in_current_span()))
}

/// The tasks a process runs for as long as it runs (its servers), each in
/// a span naming it, under one handle: dropped, every one is aborted.
#[derive(Default)]
pub struct Background(tokio::task::JoinSet<()>);

impl Background {
    /// Runs `future` as the process's `what` (in a span `server{what}`,
    /// whose lines go by the logger `what`).
    /// Must be called inside the runtime.
    pub fn spawn<F>(&mut self, what: &'static str, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        use tracing::Instrument;
        self.0.spawn(future.instrument(tracing::error_span!(
            "server",
            server = what,
            logger = what
        )));
    }
}

impl<T> Owned<T> {
    /// Waits for the task to end; an error if it panicked or was aborted.
    pub async fn join(mut self) -> Result<T, JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_handle_ends_its_task() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(task);
        // The task's sender is dropped with the task.
        assert!(rx.await.is_err());
    }

    #[tokio::test]
    async fn a_joined_task_gives_its_output() {
        assert_eq!(spawn(async { 7 }).join().await.unwrap(), 7);
    }
}
