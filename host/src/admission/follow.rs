//! Following one kind's objects with kube-runtime's watcher (which relists
//! by itself after a lost watch or a 410 Gone, with back-off), as changes
//! a cache applies: a whole new listing, an object applied, an object
//! deleted. The leases' and the other tools' watches are both this.

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};

/// One change to a watched kind.
pub(super) enum Change {
    /// Every object, as (re)listed: what was known before is replaced.
    Listed(Vec<DynamicObject>),
    Applied(DynamicObject),
    Deleted(DynamicObject),
}

/// Follows `api`'s objects until the task is dropped, handing each change
/// to `on`; a failure is logged (naming `what`) and retried.
pub(super) async fn follow(api: Api<DynamicObject>, what: &str, on: impl FnMut(Change)) {
    follow_synced(api, what, on, || {}).await
}

/// [`follow`], calling `failed` at each failure (until the next listing,
/// the cache may miss changes).
pub(super) async fn follow_synced(
    api: Api<DynamicObject>,
    what: &str,
    mut on: impl FnMut(Change),
    mut failed: impl FnMut(),
) {
    let mut events = watcher(
        api,
        watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECS),
    )
    .default_backoff()
    .boxed();
    let mut listing = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(o)) => listing.push(o),
            Ok(watcher::Event::InitDone) => on(Change::Listed(std::mem::take(&mut listing))),
            Ok(watcher::Event::Apply(o)) => on(Change::Applied(o)),
            Ok(watcher::Event::Delete(o)) => on(Change::Deleted(o)),
            Err(e) => {
                failed();
                tracing::debug!(watch = what, error = %e, "a watch failed; retrying");
            }
        }
    }
}
