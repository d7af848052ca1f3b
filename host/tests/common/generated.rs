//! Files generated from `deploy/` (the Helm chart, the OLM bundle): a test
//! checks the files on disk are the generation, and rewrites them when
//! asked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Checks that `dir`'s files are `want` (paths under `dir`), and that its
/// `subdirs` hold nothing else; with the environment variable `write` set,
/// rewrites them instead. Fails naming the files that drifted and the
/// command that rewrites them.
pub fn check(dir: &Path, subdirs: &[&str], want: &BTreeMap<PathBuf, String>, write: &str) {
    let rewrite = std::env::var_os(write).is_some();
    if rewrite {
        for sub in subdirs {
            let _ = std::fs::remove_dir_all(dir.join(sub));
        }
    }
    let mut stale = Vec::new();
    for (path, text) in want {
        let file = dir.join(path);
        if rewrite {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, text).unwrap();
        } else if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    for sub in subdirs {
        for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(dir).unwrap().to_owned();
            if !want.contains_key(&rel) {
                stale.push(format!("{} (not generated)", rel.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "{} drifted from deploy/default: {stale:?}\nrun {write}=1 cargo test -p nmo --test suite <this file>::",
        dir.display()
    );
}
