//! The record a surge keeps on the owner it raises (`SURGE_ANNOTATION`):
//! which pods it surges for which maintenance, and the replicas the owner
//! had before; and the operator's own memory of what it wrote there
//! ([`SurgeMemory`]), which is what it trusts. The drain's surges write
//! both; whoever reads an owner's replicas for a policy reads through the
//! memory the replicas as the owner set them.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::workloads::Kind;
use crate::policy::workloads::replicas_of;
use crate::sync::Locked;

/// On an owner while one of its pods is surged: what to undo.
pub(crate) const SURGE_ANNOTATION: &str = "nmo.medik8s.io/surge";
/// The label a surge puts on the owner: the maintenance whose surge wrote
/// the record last (what the operator lists owners by).
pub(crate) const SURGE_LABEL: &str = "nmo.medik8s.io/surging";
/// One surged pod in the owner's [`Record`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry {
    /// The surged pod's namespace/name and uid.
    pub(crate) pod: String,
    pub(crate) uid: String,
    pub(crate) maintenance: String,
}

/// The record in [`SURGE_ANNOTATION`]: the surges an owner runs at once,
/// at most its `maxSurge`. Its `spec.replicas` is [`Record::expected`]
/// for as long as the record is there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    /// The owner's replicas before its surges.
    pub(crate) replicas: i64,
    /// Ready pods of the owner outside these surges when they began
    /// (a pod that joins takes itself out; each surge that ends brings its
    /// replacement in): a pod leaves once one more than this serves
    /// without it, its replacement.
    pub(crate) serving: usize,
    /// Pods waiting for their replacement (one extra replica each).
    #[serde(default)]
    pub(crate) surging: Vec<Entry>,
    /// Pods whose replacement is Ready and that the owner is about to
    /// remove (their deletion cost being set; one extra replica each
    /// until then).
    #[serde(default)]
    pub(crate) leaving: Vec<Entry>,
}

/// The record a surge of an earlier version wrote (one pod per owner),
/// read so a surge running across an upgrade is resumed.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SingleRecord {
    pod: String,
    uid: String,
    replicas: i64,
    /// Ready pods of the owner on other nodes before the surge.
    ready_elsewhere: usize,
    maintenance: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Stored {
    Group(Record),
    Single(SingleRecord),
}

/// More entries than any `maxSurge` a record can come from: a record
/// with more was not written by a surge.
pub(crate) const MOST_ENTRIES: usize = 100_000;

impl Record {
    /// Reads the annotation's text; `None` for anything a surge could not
    /// have written (the record is on an object others may write).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let record = match serde_json::from_str(text).ok()? {
            Stored::Group(r) => r,
            Stored::Single(old) => Record {
                replicas: old.replicas,
                serving: old.ready_elsewhere,
                surging: vec![Entry {
                    pod: old.pod,
                    uid: old.uid,
                    maintenance: old.maintenance,
                }],
                leaving: Vec::new(),
            },
        };
        let entries = record.surging.len() + record.leaving.len();
        let fits = (0..i64::from(i32::MAX)).contains(&record.replicas)
            && entries <= MOST_ENTRIES
            && record.replicas + entries as i64 <= i64::from(i32::MAX);
        fits.then_some(record)
    }

    /// The replicas the owner has while these surges run.
    pub(crate) fn expected(&self) -> i64 {
        self.replicas + (self.surging.len() + self.leaving.len()) as i64
    }

    pub(crate) fn len(&self) -> usize {
        self.surging.len() + self.leaving.len()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.surging.iter().chain(&self.leaving)
    }

    /// Removes every entry `gone` says is over; how many went.
    pub(crate) fn prune(&mut self, gone: impl Fn(&Entry) -> bool) -> usize {
        let before = self.len();
        self.surging.retain(|e| !gone(e));
        self.leaving.retain(|e| !gone(e));
        before - self.len()
    }

    /// A record of no surge (what is remembered once the last one ends).
    pub(crate) fn none() -> Record {
        Record {
            replicas: 0,
            serving: 0,
            surging: Vec::new(),
            leaving: Vec::new(),
        }
    }

    /// The record as written back: none once no surge is left.
    pub(crate) fn kept(&self) -> Option<&Self> {
        (self.len() > 0).then_some(self)
    }
}

/// What this process's surges wrote on each owner (by the owner's uid):
/// the authority on what a surge changed and what to give back. The
/// record on the owner is a copy for whoever looks (and for a restarted
/// operator, which resumes from it); anyone who may write the owner may
/// rewrite or remove that copy, so once a surge has written an owner, the
/// copy is never read again by this process: what it undoes, and the
/// replicas a policy is told the owner had, come from here.
#[derive(Debug, Default)]
pub(crate) struct SurgeMemory(std::sync::Mutex<HashMap<String, Remembered>>);

/// One owner a surge of this process wrote, and the record as written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Remembered {
    pub(crate) kind: Kind,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) record: Record,
}

impl SurgeMemory {
    /// The record this process last wrote on the owner `uid`, while it
    /// has surges there.
    pub(crate) fn record(&self, uid: &str) -> Option<Record> {
        self.0.locked().get(uid).map(|r| r.record.clone())
    }

    /// This process wrote `record` on the owner (`None`: it removed it,
    /// no surge is left there).
    pub(crate) fn wrote(&self, uid: &str, owner: Remembered) {
        let mut map = self.0.locked();
        if owner.record.len() == 0 {
            map.remove(uid);
        } else {
            map.insert(uid.to_owned(), owner);
        }
    }

    /// This process's surges on the owner `uid` are over (the owner's
    /// replicas were set by someone else, or it is gone).
    pub(crate) fn forget(&self, uid: &str) {
        self.0.locked().remove(uid);
    }

    /// The owners with a surge of the maintenance `name`, by uid.
    pub(crate) fn holding(&self, name: &str) -> Vec<(String, Remembered)> {
        self.0
            .locked()
            .iter()
            .filter(|(_, r)| r.record.entries().any(|e| e.maintenance == name))
            .map(|(uid, r)| (uid.clone(), r.clone()))
            .collect()
    }

    /// The surge record of an owner, as far as it is trusted: this process's own memory of what it wrote, whatever
    /// the owner says now; else the record on the owner only if a surge
    /// of the operator before a restart could have left it: entries in
    /// it, its count matching the owner's replicas, the owner's label
    /// naming one of its maintenances, and every one of those
    /// maintenances `live` (exists, as far as the caller knows).
    /// Anything else on the owner is input, not authority: a forged or
    /// edited record is never read. The one rule the drain (resuming a
    /// surge) and a policy's reads go by.
    pub(crate) fn trusted(
        &self,
        owner: Found<'_>,
        live: &(dyn Fn(&str) -> bool + Sync),
    ) -> Option<Record> {
        if let Some(mine) = self.record(owner.uid) {
            return Some(mine);
        }
        let r = Record::parse(owner.annotation?)?;
        let resumable = r.len() > 0
            && r.expected() == owner.replicas
            && r.entries()
                .any(|e| Some(e.maintenance.as_str()) == owner.label)
            && r.entries().all(|e| live(&e.maintenance));
        resumable.then_some(r)
    }

    /// The replicas an owner has as its own owner set them: while a surge
    /// runs (its [`SurgeMemory::trusted`] record), the count before the
    /// surges; otherwise `spec.replicas` as it stands.
    pub(crate) fn replicas_as_set(
        &self,
        object: &Value,
        live: &(dyn Fn(&str) -> bool + Sync),
    ) -> i64 {
        let meta = &object["metadata"];
        let replicas = replicas_of(object);
        let found = Found {
            uid: meta["uid"].as_str().unwrap_or_default(),
            annotation: meta["annotations"][SURGE_ANNOTATION].as_str(),
            label: meta["labels"][SURGE_LABEL].as_str(),
            replicas,
        };
        self.trusted(found, live).map_or(replicas, |r| r.replicas)
    }
}

/// What an owner shows of a surge: its uid, its record and label, its
/// replicas.
#[derive(Clone, Copy)]
pub(crate) struct Found<'a> {
    pub uid: &'a str,
    pub annotation: Option<&'a str>,
    pub label: Option<&'a str>,
    pub replicas: i64,
}

#[cfg(test)]
mod tests {
    use super::Record;

    /// A surge running when the operator was upgraded (the one-pod record
    /// of earlier versions) is resumed: the pod is surging, and its
    /// replacement is counted above the Ready pods it found elsewhere.
    #[test]
    fn a_record_of_an_earlier_version_is_resumed() {
        let old =
            r#"{"pod":"shop/web-1","uid":"u1","replicas":3,"readyElsewhere":2,"maintenance":"nm"}"#;
        let r = Record::parse(old).expect("read");
        assert_eq!((r.replicas, r.serving, r.expected()), (3, 2, 4));
        assert_eq!(r.surging[0].uid, "u1");
        assert!(r.leaving.is_empty());
    }

    /// A record on an object others may write is trusted only as far as a
    /// surge could have written it.
    #[test]
    fn a_record_no_surge_could_have_written_is_not_read() {
        let entry = r#"{"pod":"a/b","uid":"u","maintenance":"nm"}"#;
        let record = |replicas: i64, n: usize| {
            format!(
                r#"{{"replicas":{replicas},"serving":1,"surging":[{}]}}"#,
                vec![entry; n].join(",")
            )
        };
        assert!(Record::parse(&record(3, 2)).is_some());
        assert!(Record::parse(&record(-1, 1)).is_none());
        assert!(Record::parse(&record(2147483647, 1)).is_none());
        assert!(Record::parse(&record(2147483646, 2)).is_none());
        assert!(Record::parse("not json").is_none());
    }

    /// A policy reads the replicas as the owner set them from the
    /// operator's own memory; a record on the owner only when a surge
    /// before a restart could have left it (its count matching, its
    /// maintenances there); a forged one never.
    #[test]
    fn a_record_on_the_owner_is_input_not_authority() {
        use super::{Kind, Remembered, SurgeMemory};
        let owner = |replicas: i64, record: &str| {
            serde_json::json!({"metadata": {"uid": "o1", "annotations": {"nmo.medik8s.io/surge": record},
                "labels": {"nmo.medik8s.io/surging": "nm"}},
                "spec": {"replicas": replicas}})
        };
        let record =
            r#"{"replicas":1,"serving":0,"surging":[{"pod":"a/b","uid":"u","maintenance":"nm"}]}"#;
        let memory = SurgeMemory::default();
        let live = |m: &str| m == "nm";
        // Left by a surge before a restart: read.
        assert_eq!(memory.replicas_as_set(&owner(2, record), &live), 1);
        // Forged: its count does not match, or its maintenance is not there,
        // or the label does not name it.
        assert_eq!(memory.replicas_as_set(&owner(3, record), &live), 3);
        let mut unlabelled = owner(2, record);
        unlabelled["metadata"]["labels"] = serde_json::json!({});
        assert_eq!(memory.replicas_as_set(&unlabelled, &live), 2);
        assert_eq!(
            memory.replicas_as_set(&owner(2, record), &|_: &str| false),
            2
        );
        // This process's own record wins over whatever the owner says.
        let mine = Record::parse(record).unwrap();
        memory.wrote(
            "o1",
            Remembered {
                kind: Kind::Deployment,
                namespace: "a".into(),
                name: "web".into(),
                record: Record {
                    replicas: 4,
                    ..mine
                },
            },
        );
        assert_eq!(
            memory.replicas_as_set(&owner(5, "garbage"), &|_: &str| false),
            4
        );
        memory.forget("o1");
        assert_eq!(memory.replicas_as_set(&owner(5, "garbage"), &live), 5);
    }
}
