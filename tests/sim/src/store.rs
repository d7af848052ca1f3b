//! The object store: every object as JSON, one global resourceVersion, a
//! change history for watches that resume, and a broadcast of changes.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

/// Changes kept for watches that resume from a resourceVersion; older ones
/// get 410 Gone, as after an etcd compaction.
pub const HISTORY: usize = 50_000;

/// Namespace (empty for cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    pub namespace: String,
    pub name: String,
}

impl ObjKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        ObjKey {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The key of a stored object.
    pub fn of(obj: &Value) -> Self {
        ObjKey::new(
            obj["metadata"]["namespace"].as_str().unwrap_or_default(),
            obj["metadata"]["name"].as_str().unwrap_or_default(),
        )
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct Change {
    pub storage: String,
    pub kind: ChangeKind,
    pub object: Arc<Value>,
    pub old: Option<Arc<Value>>,
    pub rv: u64,
}

/// Receives changes as they happen.
pub type ChangeReceiver = broadcast::Receiver<Arc<Change>>;

/// A store's content at one moment (see [`Store::snapshot`]).
#[derive(Debug, Clone)]
pub struct StoreSnapshot {
    rv: u64,
    data: HashMap<String, BTreeMap<ObjKey, Arc<Value>>>,
    by_uid: HashMap<String, (String, ObjKey)>,
    pods_on: HashMap<String, BTreeSet<ObjKey>>,
}

/// The store. Not thread-safe by itself: the server keeps it in a mutex.
pub struct Store {
    rv: u64,
    history_limit: usize,
    data: HashMap<String, BTreeMap<ObjKey, Arc<Value>>>,
    by_uid: HashMap<String, (String, ObjKey)>,
    history: VecDeque<Arc<Change>>,
    tx: broadcast::Sender<Arc<Change>>,
    /// Pod changes by node (the pod's node before and after), for the
    /// watches of one node's pods: as the API server's watch cache indexes
    /// pods by `spec.nodeName`, such a watch is not woken by every pod of
    /// the cluster.
    by_node: HashMap<String, broadcast::Sender<Arc<Change>>>,
    /// The pods on each node (by `spec.nodeName`, "" for none), as the
    /// API server's watch cache indexes them: a list of one node's pods,
    /// or the kubelet's look at a node that changed, reads that node's
    /// pods only.
    pods_on: HashMap<String, BTreeSet<ObjKey>>,
}

/// Changes a watch of one node's pods may fall behind by before it ends
/// (and its client relists).
pub const NODE_QUEUE: usize = 4096;

impl Default for Store {
    fn default() -> Self {
        Self::new(HISTORY)
    }
}

impl Store {
    /// A store that keeps `history` changes for resuming watches.
    pub fn new(history: usize) -> Self {
        let history = history.max(1);
        let (tx, _) = broadcast::channel(HISTORY);
        Store {
            rv: 1,
            history_limit: history,
            data: HashMap::new(),
            by_uid: HashMap::new(),
            history: VecDeque::new(),
            tx,
            by_node: HashMap::new(),
            pods_on: HashMap::new(),
        }
    }

    /// The latest resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, storage: &str, key: &ObjKey) -> Option<Arc<Value>> {
        self.data.get(storage)?.get(key).cloned()
    }

    /// All objects of a storage, in key order, optionally in one namespace.
    pub fn list(&self, storage: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let Some(m) = self.data.get(storage) else {
            return Vec::new();
        };
        match namespace {
            Some(ns) => m
                .range(ObjKey::new(ns, "")..)
                .take_while(|(k, _)| k.namespace == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => m.values().cloned().collect(),
        }
    }

    /// The pods on `node` ("" for those on none), in key order.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<Value>> {
        let (Some(keys), Some(pods)) = (self.pods_on.get(node), self.data.get("pods")) else {
            return Vec::new();
        };
        keys.iter().filter_map(|k| pods.get(k).cloned()).collect()
    }

    /// Keeps [`pods_on`](Self::pods_on) true across a pod's change from
    /// `old` to `new` (either absent).
    fn index_pod(&mut self, key: &ObjKey, old: Option<&Value>, new: Option<&Value>) {
        let old = old.map(pod_node);
        let new = new.map(pod_node);
        if old == new {
            return;
        }
        if let Some(n) = old
            && let Some(keys) = self.pods_on.get_mut(n.as_ref())
        {
            keys.remove(key);
            if keys.is_empty() {
                self.pods_on.remove(n.as_ref());
            }
        }
        if let Some(n) = new {
            self.pods_on
                .entry(n.into_owned())
                .or_default()
                .insert(key.clone());
        }
    }

    /// How many objects a storage holds.
    pub fn count(&self, storage: &str) -> usize {
        self.data.get(storage).map_or(0, BTreeMap::len)
    }

    /// Whether an object with this uid exists.
    pub fn has_uid(&self, uid: &str) -> bool {
        self.by_uid.contains_key(uid)
    }

    /// Finds an object by uid.
    pub fn by_uid(&self, uid: &str) -> Option<(String, Arc<Value>)> {
        let (storage, key) = self.by_uid.get(uid)?;
        Some((storage.clone(), self.get(storage, key)?))
    }

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        if self.history.len() >= self.history_limit {
            self.history.pop_front();
        }
        self.history.push_back(change.clone());
        if change.storage == "pods" && !self.by_node.is_empty() {
            let now = pod_node(&change.object);
            let before = change.old.as_deref().map(pod_node);
            let before = before.filter(|b| *b != now);
            for n in std::iter::once(now).chain(before) {
                if let Some(tx) = self.by_node.get(n.as_ref())
                    && tx.send(change.clone()).is_err()
                {
                    // Nobody watches that node any more.
                    self.by_node.remove(n.as_ref());
                }
            }
        }
        let _ = self.tx.send(change);
    }

    /// Stores `obj` (new or replacing), stamping a new resourceVersion.
    /// Returns the stored object.
    pub fn put(&mut self, storage: &str, mut obj: Value) -> Arc<Value> {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let key = ObjKey::of(&obj);
        let uid = obj["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let obj = Arc::new(obj);
        let old = self
            .data
            .entry(storage.to_owned())
            .or_default()
            .insert(key.clone(), obj.clone());
        if storage == "pods" {
            self.index_pod(&key, old.as_deref(), Some(&*obj));
        }
        if !uid.is_empty() {
            self.by_uid.insert(uid, (storage.to_owned(), key));
        }
        let kind = if old.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.record(Change {
            storage: storage.to_owned(),
            kind,
            object: obj.clone(),
            old,
            rv: self.rv,
        });
        obj
    }

    /// Removes an object for good. Returns it as last stored, with the
    /// deletion's resourceVersion.
    pub fn remove(&mut self, storage: &str, key: &ObjKey) -> Option<Arc<Value>> {
        let old = self.data.get_mut(storage)?.remove(key)?;
        self.rv += 1;
        if let Some(uid) = old["metadata"]["uid"].as_str() {
            self.by_uid.remove(uid);
        }
        if storage == "pods" {
            self.index_pod(key, Some(&old), None);
        }
        let mut last = (*old).clone();
        last["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let last = Arc::new(last);
        self.record(Change {
            storage: storage.to_owned(),
            kind: ChangeKind::Deleted,
            object: last.clone(),
            old: Some(old),
            rv: self.rv,
        });
        Some(last)
    }

    /// A receiver for the changes to come: every change, or with `node`,
    /// the changes of the pods on that node (before or after the change).
    pub fn receiver(&mut self, node: Option<&str>) -> ChangeReceiver {
        match node {
            None => self.tx.subscribe(),
            Some(n) => self
                .by_node
                .entry(n.to_owned())
                .or_insert_with(|| broadcast::channel(NODE_QUEUE).0)
                .subscribe(),
        }
    }

    /// The changes after `rv` (for a resuming watch) and a receiver for the
    /// ones to come (see [`receiver`](Self::receiver)). `None` when `rv` is
    /// older than the history kept.
    pub fn subscribe_from(
        &mut self,
        rv: u64,
        node: Option<&str>,
    ) -> Option<(Vec<Arc<Change>>, ChangeReceiver)> {
        // A resourceVersion from the future starts from now.
        let backlog = if rv >= self.rv {
            Vec::new()
        } else {
            self.changes_since(rv)?
        };
        Some((backlog, self.receiver(node)))
    }

    /// The changes after `rv`, in order; `None` when some of them are no
    /// longer kept (or the store went back to an older resourceVersion).
    pub fn changes_since(&self, rv: u64) -> Option<Vec<Arc<Change>>> {
        if rv > self.rv {
            return None;
        }
        if rv == self.rv {
            return Some(Vec::new());
        }
        let oldest = self.history.front().map_or(self.rv, |c| c.rv);
        if rv + 1 < oldest {
            return None;
        }
        let from = self.history.partition_point(|c| c.rv <= rv);
        Some(self.history.range(from..).cloned().collect())
    }

    /// The objects and the resourceVersion now, to [`restore`](Self::restore)
    /// later.
    pub fn snapshot(&self) -> StoreSnapshot {
        StoreSnapshot {
            rv: self.rv,
            data: self.data.clone(),
            by_uid: self.by_uid.clone(),
            pods_on: self.pods_on.clone(),
        }
    }

    /// Goes back to a snapshot, as an API server restored from an etcd
    /// backup: the objects and the resourceVersion are the snapshot's (so
    /// resourceVersions go backwards), the watch history is gone, and every
    /// open watch ends (the server restarted).
    pub fn restore(&mut self, snapshot: StoreSnapshot) {
        self.rv = snapshot.rv;
        self.data = snapshot.data;
        self.by_uid = snapshot.by_uid;
        self.pods_on = snapshot.pods_on;
        self.history.clear();
        let (tx, _) = broadcast::channel(HISTORY);
        self.tx = tx;
        self.by_node.clear();
    }
}

/// A pod's node, as a field selector reads it; no node is the empty one
/// (what `spec.nodeName=` selects).
fn pod_node(o: &Value) -> std::borrow::Cow<'_, str> {
    crate::selectors::FieldSelector::text(o, "spec.nodeName")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>) -> Value {
        let mut p =
            json!({"metadata": {"namespace": "default", "name": name, "uid": name}, "spec": {}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    fn names(rx: &mut ChangeReceiver) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|c| {
                format!(
                    "{} {}",
                    c.kind.as_str(),
                    c.object["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn a_watch_of_one_nodes_pods_sees_that_nodes_changes_only() {
        let mut store = Store::new(100);
        let mut on_a = store.receiver(Some("a"));
        let mut unscheduled = store.receiver(Some(""));
        let mut all = store.receiver(None);
        store.put("pods", pod("p1", Some("a")));
        store.put("pods", pod("p2", Some("b")));
        // Scheduled onto a: seen by both the unscheduled and a's watch.
        store.put("pods", pod("p3", None));
        store.put("pods", pod("p3", Some("a")));
        // Moved away from a (old node a): a's watch still hears of it.
        store.put("pods", pod("p1", Some("b")));
        store.remove("pods", &ObjKey::new("default", "p2"));
        // Not a pod: never on a node's feed.
        store.put(
            "nodes",
            json!({"metadata": {"name": "a", "uid": "na"}, "spec": {"nodeName": "a"}}),
        );
        assert_eq!(names(&mut on_a), ["ADDED p1", "MODIFIED p3", "MODIFIED p1"]);
        assert_eq!(names(&mut unscheduled), ["ADDED p3", "MODIFIED p3"]);
        assert_eq!(names(&mut all).len(), 7);
    }

    #[test]
    fn a_node_feed_nobody_reads_is_dropped_and_made_again_when_asked() {
        let mut store = Store::new(100);
        drop(store.receiver(Some("a")));
        store.put("pods", pod("p1", Some("a")));
        assert!(store.by_node.is_empty());
        let mut on_a = store.receiver(Some("a"));
        store.put("pods", pod("p2", Some("a")));
        assert_eq!(names(&mut on_a), ["ADDED p2"]);
    }

    #[test]
    fn a_restore_ends_the_node_feeds() {
        let mut store = Store::new(100);
        let snapshot = store.snapshot();
        let mut on_a = store.receiver(Some("a"));
        store.restore(snapshot);
        assert!(matches!(
            on_a.try_recv(),
            Err(broadcast::error::TryRecvError::Closed)
        ));
    }

    fn on(store: &Store, node: &str) -> Vec<String> {
        store
            .pods_on(node)
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_node_index_follows_pods_that_come_move_and_go() {
        let mut store = Store::new(100);
        store.put("pods", pod("p1", Some("a")));
        store.put("pods", pod("p2", None));
        store.put("pods", pod("p3", Some("a")));
        // A node never seen, and a node name that is a prefix of another.
        assert!(on(&store, "b").is_empty());
        assert!(on(&store, "").contains(&"p2".to_owned()));
        assert_eq!(on(&store, "a"), ["p1", "p3"]);
        // Scheduled, moved, removed.
        store.put("pods", pod("p2", Some("a")));
        store.put("pods", pod("p1", Some("ab")));
        store.remove("pods", &ObjKey::new("default", "p3"));
        assert_eq!(on(&store, "a"), ["p2"]);
        assert_eq!(on(&store, "ab"), ["p1"]);
        assert!(on(&store, "").is_empty());
        // A nodeName that is not a string is indexed as a selector reads it.
        store.put(
            "pods",
            json!({"metadata": {"namespace": "default", "name": "p4", "uid": "p4"}, "spec": {"nodeName": 7}}),
        );
        assert_eq!(on(&store, "7"), ["p4"]);
        // Objects of other kinds are not indexed, whatever they hold.
        store.put(
            "configmaps",
            json!({"metadata": {"namespace": "default", "name": "c"}, "spec": {"nodeName": "a"}}),
        );
        assert_eq!(on(&store, "a"), ["p2"]);
    }

    #[test]
    fn a_restore_rebuilds_the_node_index() {
        let mut store = Store::new(100);
        store.put("pods", pod("p1", Some("a")));
        let snapshot = store.snapshot();
        store.put("pods", pod("p1", Some("b")));
        store.put("pods", pod("p2", Some("a")));
        store.restore(snapshot);
        assert_eq!(on(&store, "a"), ["p1"]);
        assert!(on(&store, "b").is_empty());
    }
}
