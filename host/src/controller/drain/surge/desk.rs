//! The desks: one per owner being surged, shared by every surge of its
//! pods; its watch of the owner and its pods, and the look that reads
//! them once the watch shows this process's writes.

use super::*;

/// The owners being surged, each with its [`Desk`]: every surge of one
/// owner, whatever its maintenance, shares one watch of it and one read
/// per change of it.
#[derive(Default)]
pub(crate) struct Desks {
    pub(super) slots: std::sync::Mutex<HashMap<(String, String), Slot>>,
    /// What the surges of this process wrote on owners.
    pub(super) memory: Arc<SurgeMemory>,
}

/// Where one owner's desk is found: opened by the first surge that needs
/// it while the others of the owner wait, so a hundred surges starting at
/// once find the owner once, not a hundred times.
pub(super) type Slot = Arc<tokio::sync::Mutex<Weak<Desk>>>;

impl std::fmt::Debug for Desks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Desks")
    }
}

impl Desks {
    /// The desk of the ReplicaSet `rs`'s owner, opened (its watch started)
    /// by the first surge that needs it; it closes when the last one ends.
    pub(super) async fn open(
        &self,
        client: &Client,
        namespace: &str,
        rs: &str,
    ) -> kube::Result<Arc<Desk>> {
        let slot = self.slot((namespace.to_owned(), rs.to_owned()));
        let mut desk = slot.lock().await;
        if let Some(open) = desk.upgrade() {
            return Ok(open);
        }
        let found = owner(client, namespace, rs, &self.memory).await?;
        let open = Arc::new(Desk::watching(client, namespace, &found));
        *desk = Arc::downgrade(&open);
        Ok(open)
    }

    /// What the surges of this process wrote on owners.
    pub(crate) fn memory(&self) -> &Arc<SurgeMemory> {
        &self.memory
    }

    /// The slot of `key`; the slots of closed desks no one is opening go.
    pub(super) fn slot(&self, key: (String, String)) -> Slot {
        let mut map = self.slots.locked();
        map.retain(|_, slot| {
            Arc::strong_count(slot) > 1 || slot.try_lock().map_or(true, |d| d.strong_count() > 0)
        });
        map.entry(key).or_default().clone()
    }
}

/// One read of an owner and its pods, and the change count it was read
/// at.
pub(super) type Read = (u64, Owner, Arc<[Arc<Pod>]>);

/// One owner's surges' shared view: its watch (the owner by name, its
/// pods by selector, through kube-runtime's watcher) counts changes, and
/// a look reads the owner and its pods once per change, for every surge
/// waiting on it: a hundred pods of one owner waiting for their
/// replacements make one read per change, not a hundred, and none while
/// nothing changes. While the watch fails (an RBAC that does not let the
/// operator watch the owner's kind, an API outage) the count moves every
/// [`POLL`] instead.
pub(super) struct Desk {
    /// Changes seen; none when the owner's selector cannot be read (each
    /// look then reads afresh, and evicts).
    pub(super) changes: Option<tokio::sync::watch::Receiver<u64>>,
    /// The owner and its pods as the watch shows them.
    pub(super) view: Option<Arc<View>>,
    /// The last read, and the change count it was read at.
    pub(super) last: tokio::sync::Mutex<Option<Read>>,
    /// Held by the surge whose look it is.
    pub(super) turn: tokio::sync::Mutex<()>,
    /// Every surge of the owner running here, by its pod's uid.
    pub(super) joining: std::sync::Mutex<HashMap<String, Entry>>,
    /// The pods waiting to be handed over.
    pub(super) handing: std::sync::Mutex<Vec<Handing>>,
    /// Pods another surge's look handed over with its own (by uid), and
    /// the owner as it names it: their own surges end at their next look.
    pub(super) handed: std::sync::Mutex<HashMap<String, String>>,
    /// The owner as first found (its API, kind and name: a look reads it
    /// again by name, without the ReplicaSet in between).
    pub(super) found: Owner,
    pub(super) _watch: Option<crate::task::Owned<()>>,
}

impl Desk {
    pub(super) fn watching(client: &Client, namespace: &str, owner: &Owner) -> Desk {
        use futures::StreamExt;
        use kube::runtime::{reflector, watcher};
        let Some(selector) = owner.selector() else {
            return Desk::of(owner, None, None, None);
        };
        let (view, owner_writer, pods_writer) = View::new(owner.kind.resource());
        let view = Arc::new(view);
        let config = || watcher::Config::default().timeout(crate::client::WATCH_TIMEOUT_SECS);
        let by_name = config().fields(&format!("metadata.name={}", owner.object.name_any()));
        let itself = reflector(owner_writer, watcher(owner.api.clone(), by_name))
            .map(|e| e.map(|e| Shown::of(OWNER, &e)).ok());
        let pods = reflector(
            pods_writer,
            watcher(
                Api::<Pod>::namespaced(client.clone(), namespace),
                config().labels(&selector),
            ),
        )
        .map(|e| e.map(|e| Shown::of(PODS, &e)).ok());
        let mut events = futures::stream::select(itself, pods).boxed();
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let shown = view.clone();
        let watch = crate::task::spawn(async move {
            use futures::FutureExt;
            loop {
                match events.next().await {
                    Some(Some(s)) => shown.saw(s),
                    // The watch failed (the watcher tries again itself).
                    Some(None) | None => tokio::time::sleep(POLL).await,
                }
                // What else arrived with it is the same change.
                while let Some(Some(e)) = events.next().now_or_never() {
                    if let Some(s) = e {
                        shown.saw(s);
                    }
                }
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        Desk::of(owner, Some(rx), Some(view), Some(watch))
    }

    pub(super) fn of(
        owner: &Owner,
        changes: Option<tokio::sync::watch::Receiver<u64>>,
        view: Option<Arc<View>>,
        watch: Option<crate::task::Owned<()>>,
    ) -> Desk {
        Desk {
            changes,
            view,
            last: tokio::sync::Mutex::new(None),
            turn: tokio::sync::Mutex::new(()),
            joining: std::sync::Mutex::new(HashMap::new()),
            handing: std::sync::Mutex::new(Vec::new()),
            handed: std::sync::Mutex::new(HashMap::new()),
            found: owner.clone(),
            _watch: watch,
        }
    }

    /// The changes seen so far (a look taken now is at least this fresh).
    pub(super) fn seen(&self) -> u64 {
        self.changes.as_ref().map_or(0, |c| *c.borrow())
    }

    /// The owner and its pods as of the latest change: as the watch shows
    /// them once it shows every write this process made to them (a look
    /// then costs no request), else read once per change, the owner before
    /// its pods (a surge another look finished since is in the record as
    /// leaving, or its pod carries the lowest cost), and shared by the
    /// surges looking at that change.
    pub(super) async fn read(
        &self,
        client: &Client,
        namespace: &str,
    ) -> kube::Result<(Owner, Arc<[Arc<Pod>]>)> {
        if let Some(shown) = self.shown().await {
            return Ok(shown);
        }
        let at = self.seen();
        let mut last = self.last.lock().await;
        if let Some((seen, owner, pods)) = last.as_ref()
            && *seen == at
            && self.changes.is_some()
        {
            return Ok((owner.clone(), pods.clone()));
        }
        let mut owner = self.found.clone();
        owner.object = owner.api.get(&self.found.object.name_any()).await?;
        let pods: Arc<[Arc<Pod>]> = match owner.selector() {
            Some(selector) => owner_pods(client, namespace, &selector)
                .await?
                .into_iter()
                .map(Arc::new)
                .collect(),
            None => Arc::from([]),
        };
        *last = Some((at, owner.clone(), pods.clone()));
        Ok((owner, pods))
    }

    /// The owner and its pods as the watch shows them, once it shows this
    /// process's last writes: waited for up to [`POLL`] (the watch is
    /// usually a few milliseconds behind a write); `None` when it does not
    /// catch up by then, is not listed yet, or is failing.
    pub(super) async fn shown(&self) -> Option<(Owner, Arc<[Arc<Pod>]>)> {
        let view = self.view.as_ref()?;
        let mut changes = self.changes.clone()?;
        if !view.current() {
            let caught_up = changes.wait_for(|_| view.current());
            tokio::time::timeout(POLL, caught_up).await.ok()?.ok()?;
        }
        let object = view.owner.state().into_iter().next()?;
        let owner = Owner {
            object: (*object).clone(),
            wrote: false,
            ..self.found.clone()
        };
        let pods: Arc<[Arc<Pod>]> = view.pods.state().into();
        Some((owner, pods))
    }

    /// This process wrote the pod `pod` (as it now is): the next read
    /// shows it.
    pub(super) fn wrote_pod(&self, pod: &Pod) {
        if let Some(view) = &self.view {
            view.wrote(PODS, &pod.metadata);
        }
    }

    /// This process wrote the owner (as `owner` now is): the next read
    /// shows it.
    pub(super) async fn wrote(&self, owner: &Owner) {
        if let Some(view) = &self.view {
            view.wrote(OWNER, &owner.object.metadata);
        }
        *self.last.lock().await = None;
    }

    /// Waits for a change after `seen`, for the pod `uid` to leave the
    /// node, or for `deadline`.
    pub(super) async fn next(&self, seen: u64, deadline: Instant, state: &Attempt, uid: &str) {
        let changed = async {
            let Some(mut changes) = self.changes.clone() else {
                return tokio::time::sleep(POLL).await;
            };
            if changes.wait_for(|n| *n != seen).await.is_err() {
                tokio::time::sleep(POLL).await;
            }
        };
        let gone = async {
            loop {
                let notified = state.changed.notified();
                if !state.has(uid).await {
                    return;
                }
                notified.await;
            }
        };
        tokio::select! {
            () = changed => {}
            () = gone => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// The owner's watch, in [`View`]'s counts.
pub(super) const OWNER: usize = 0;
/// The pods' watch.
pub(super) const PODS: usize = 1;

/// What one event of a watch showed: the resourceVersion of its object,
/// or that a list ended.
#[derive(Clone, Copy)]
pub(super) enum Shown {
    Version(usize, u64),
    Listed(usize),
    Nothing,
}

impl Shown {
    pub(super) fn of<K: kube::Resource>(
        watch: usize,
        e: &kube::runtime::watcher::Event<K>,
    ) -> Shown {
        use kube::runtime::watcher::Event;
        match e {
            Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                version(o.meta()).map_or(Shown::Nothing, |v| Shown::Version(watch, v))
            }
            Event::InitDone => Shown::Listed(watch),
            Event::Init => Shown::Nothing,
        }
    }
}

/// A resourceVersion as the number the API server makes of it (etcd's
/// revision); `None` for one that is not, and then the watch is never
/// taken to show a write and every look reads.
pub(super) fn version(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// The owner and its pods as the desk's watch shows them (kube-runtime's
/// reflector stores), and how far it has shown: a look reads them instead
/// of the API server once they show every write this process made.
pub(super) struct View {
    pub(super) owner: kube::runtime::reflector::Store<DynamicObject>,
    pub(super) pods: kube::runtime::reflector::Store<Pod>,
    /// Per watch: the newest resourceVersion shown.
    pub(super) seen: [std::sync::atomic::AtomicU64; 2],
    /// Per watch: a list has completed (the store holds every object).
    pub(super) listed: [std::sync::atomic::AtomicBool; 2],
    /// Per watch: the newest resourceVersion this process wrote;
    /// `u64::MAX` once one was not a number.
    pub(super) written: [std::sync::atomic::AtomicU64; 2],
}

impl View {
    /// An empty view of an owner of `resource`, and the stores' writers
    /// for its watches.
    pub(super) fn new(resource: ApiResource) -> (View, Writer<DynamicObject>, Writer<Pod>) {
        let owner = Writer::new(resource);
        let pods = Writer::<Pod>::default();
        let view = View {
            owner: owner.as_reader(),
            pods: pods.as_reader(),
            seen: Default::default(),
            listed: Default::default(),
            written: Default::default(),
        };
        (view, owner, pods)
    }

    pub(super) fn saw(&self, shown: Shown) {
        use std::sync::atomic::Ordering::SeqCst;
        match shown {
            Shown::Version(w, v) => {
                self.seen[w].fetch_max(v, SeqCst);
            }
            Shown::Listed(w) => self.listed[w].store(true, SeqCst),
            Shown::Nothing => {}
        }
    }

    pub(super) fn wrote(
        &self,
        watch: usize,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) {
        let v = version(meta).unwrap_or(u64::MAX);
        self.written[watch].fetch_max(v, std::sync::atomic::Ordering::SeqCst);
    }

    /// Both watches listed, and showing this process's last writes.
    pub(super) fn current(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        (0..2).all(|w| {
            self.listed[w].load(SeqCst)
                && self.written[w].load(SeqCst) != u64::MAX
                && self.seen[w].load(SeqCst) >= self.written[w].load(SeqCst)
        })
    }
}

/// What a pod waits for while its owner is busy: surging as many of its
/// pods as its `maxSurge` allows, or settling (a rollout, or catching up
/// with the last surge). One text for both: a pod waiting its turn shows
/// it steadily, not flapping between the two at every change of the
/// owner.
pub(super) fn busy(t: &Target, owner: &Owner) -> String {
    format!(
        "surging pod {}: waiting its turn: {} is surging as many pods as its maxSurge allows or rolling out",
        t.key(),
        owner.shown()
    )
}

/// What one look found for a pod.
pub(super) enum Looked {
    /// Over, or waiting: as the step says.
    Step(Step),
    /// Its replacement is Ready: it leaves once its budgets allow.
    Ready,
}

/// One look: start or join the owner's surges, or see how far this one
/// is.
pub(super) async fn look(
    how: Removal<'_>,
    desk: &Desk,
    t: &Target,
    owner: &mut Owner,
    pods: &[Arc<Pod>],
) -> kube::Result<Looked> {
    if owner.selector().is_none() {
        return Ok(Looked::Step(Step::Over(Surged::Evict(format!(
            "{} has no selector the host can read",
            owner.shown()
        )))));
    }
    let Some(record) = owner.record() else {
        return start(how, desk, t, owner, pods).await.map(Looked::Step);
    };
    // Someone else set the replicas meanwhile (an autoscaler, a GitOps
    // tool setting them back before the replacement is Ready): theirs
    // stand, the record goes, and the pod is evicted instead. Looked at
    // before the replacement, so an owner whose replicas keep being set
    // back never holds the drain waiting for one.
    if owner.replicas() != record.expected() {
        let why = format!(
            "the replicas of {} changed to {} during the surge (an autoscaler or GitOps tool?); \
             kept, and the pod is evicted instead",
            owner.shown(),
            owner.replicas()
        );
        owner.write(owner.replicas(), None).await?;
        return Ok(Looked::Step(Step::Over(Surged::Evict(why))));
    }
    // A hand-over claims and lowers in one turn: pods still leaving in a
    // look are a lowering that failed, or an operator restarted between
    // the two. Whoever looks first finishes them.
    if !record.leaving.is_empty() {
        let this = record.leaving.iter().any(|e| e.uid == t.uid);
        finish(how.client, desk, owner, record).await?;
        if this {
            let _ = how.notes.send(Note::Surged {
                pod: t.reference(),
                owner: owner.shown(),
            });
            return Ok(Looked::Step(Step::Over(Surged::Done)));
        }
        return Ok(Looked::Step(Step::Waiting(busy(t, owner))));
    }
    if !record.surging.iter().any(|e| e.uid == t.uid) {
        return join(how, desk, t, owner, record, pods)
            .await
            .map(Looked::Step);
    }
    let entries: Vec<&str> = record.entries().map(|e| e.uid.as_str()).collect();
    // The ReplicaSet controller removes a not-Ready pod before the one
    // with the lowest deletion cost: lowering the replicas while another
    // surge's replacement is still starting would remove that replacement.
    // So surges of one owner raise their replicas together and hand over
    // once every replacement they brought is Ready.
    // Fewer pods than replicas: a raise the ReplicaSet controller has not
    // acted on. Lowering them now would only cancel the pod not yet made,
    // and this one would stay. (More is fine: pods handed over a moment
    // ago and not yet removed carry the lowest cost too, and go first.)
    if serving(pods, &entries) <= record.serving
        || (live(pods) as i64) < record.expected()
        || !others_ready(pods, &[t.uid.as_str()])
    {
        return Ok(Looked::Step(Step::Waiting(waiting_replacement(t, owner))));
    }
    Ok(Looked::Ready)
}

/// The owner's ReplicaSets' pods (not counting those already
/// terminating) against `replicas`: more is a lowered count the
/// ReplicaSet controller has not acted on yet, fewer a raised one. Either
/// way a change of the replicas now would be folded into that one: a
/// surge raising them would keep the pod another just handed over, one
/// lowering them would take back another's replacement before it exists,
/// and in both cases the handed-over pod stays and the replacement a
/// surge waits for never comes.
pub(super) fn catching_up(pods: &[Arc<Pod>], replicas: i64) -> bool {
    live(pods) as i64 != replicas
}

/// Whether every pod the owner's ReplicaSets keep is Ready, but those
/// in `except` (uids: the pods about to leave). A pod not Ready would be
/// removed before them when the replicas go down.
pub(super) fn others_ready(pods: &[Arc<Pod>], except: &[&str]) -> bool {
    kept(pods)
        .filter(|p| !except.contains(&p.metadata.uid.as_deref().unwrap_or_default()))
        .all(crate::policy::convert::pod_ready)
}

pub(super) fn live(pods: &[Arc<Pod>]) -> usize {
    kept(pods).count()
}

/// The pods the owner's ReplicaSets keep: not already terminating.
pub(super) fn kept(pods: &[Arc<Pod>]) -> impl Iterator<Item = &Pod> {
    pods.iter().map(|p| &**p).filter(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && o.kind == "ReplicaSet")
    })
}
