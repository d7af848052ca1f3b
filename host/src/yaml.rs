//! YAML the operator and its tools read: parsed with serde-saphyr under a
//! budget (nesting depth, node and document counts, total size), so no
//! file, ConfigMap key or scenario can make a parse take unbounded time or
//! memory; and files read whole only when they are regular files under a
//! size limit.
//!
//! Errors of files that are data, not configuration ([`documents_redacted`],
//! for the pods a scenario names) never carry the text that failed to
//! parse: they name the line and column and what was wrong, not the content
//! there (a scenario naming a file it should not read must not print it).

use std::io::Read;
use std::path::Path;

use serde::de::DeserializeOwned;

/// Nesting depth of any document (the policy set's and a scenario's are a
/// handful deep; a Pod list saved from kubectl, about 15).
pub(crate) const MAX_DEPTH: usize = 64;
/// Nodes (maps, lists and scalars) of one data input (a Pod list saved
/// from kubectl).
pub(crate) const MAX_NODES: usize = 2_000_000;
/// Nodes of one configuration document (`policies.yaml` has a few
/// hundred; a ConfigMap's 1 MiB of plain keys, about this many). An alias
/// bomb is refused once its expansion reaches it: a twentieth of the work
/// the data budget allowed it (3.7 s of CPU before).
pub(crate) const MAX_CONFIG_NODES: usize = 100_000;

/// Why YAML could not be read.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("{path}: over {limit} bytes")]
    TooLarge { path: String, limit: u64 },
    #[error("{path}: not a regular file")]
    NotAFile { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Parse(String),
}

/// Parse options under a budget of `nodes` nodes.
fn options_for(nodes: usize) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.max_nodes = nodes;
    budget.max_events = nodes * 2;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Options for data files (and multi-document streams).
fn options() -> serde_saphyr::Options {
    options_for(MAX_NODES)
}

/// A parse error in words (no source snippet).
fn parse_error(e: &serde_saphyr::Error) -> YamlError {
    let text = e.without_snippet().to_string();
    YamlError::Parse(text.lines().next().unwrap_or("not valid YAML").to_owned())
}

/// A parse error in words, without the content it was about: where, and
/// what kind of problem.
fn redacted_error(e: &serde_saphyr::Error) -> YamlError {
    let kind = e.without_snippet().to_string();
    // The first line names the problem; serde's own messages may quote a
    // value ("invalid type: string \"...\""): quoted parts are dropped.
    let first = kind.lines().next().unwrap_or("not valid YAML");
    let mut plain = String::new();
    let mut quoted = false;
    for c in first.chars() {
        match c {
            '"' | '`' => {
                quoted = !quoted;
                if quoted {
                    plain.push_str("(…)");
                }
            }
            _ if !quoted => plain.push(c),
            _ => {}
        }
    }
    match e.location() {
        Some(at) => YamlError::Parse(format!(
            "line {}, column {}: {}",
            at.line(),
            at.column(),
            plain.trim()
        )),
        None => YamlError::Parse(plain.trim().to_owned()),
    }
}

/// One configuration document, under the configuration budget
/// ([`MAX_CONFIG_NODES`]). The budget is checked on the document as plain
/// data first: a typed parse that breaches it mid-way may report a
/// confusing error of its own (an `Option` field trying another shape),
/// the plain one says what was exceeded.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let options = || options_for(MAX_CONFIG_NODES);
    serde_saphyr::from_str_with_options::<serde_json::Value>(text, options())
        .map_err(|e| parse_error(&e))?;
    serde_saphyr::from_str_with_options(text, options()).map_err(|e| parse_error(&e))
}

/// One document from bytes (UTF-8).
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, YamlError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| YamlError::Parse(format!("not UTF-8 (at byte {})", e.valid_up_to())))?;
    from_str(text)
}

/// Every document of a stream (empty ones left out).
pub fn documents<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, YamlError> {
    serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| parse_error(&e))
}

/// [`documents`] of a data file: an error never quotes its content.
pub(crate) fn documents_redacted<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, YamlError> {
    serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| redacted_error(&e))
}

/// YAML text of a value.
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, YamlError> {
    serde_saphyr::to_string(value).map_err(|e| YamlError::Parse(e.to_string()))
}

/// Reads a regular file of at most `limit` bytes (a device, a FIFO or a
/// directory is refused before any read).
pub fn read_file(path: &Path, limit: u64) -> Result<String, YamlError> {
    let shown = || path.display().to_string();
    let io = |source| YamlError::Io {
        path: shown(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(YamlError::NotAFile { path: shown() });
    }
    if meta.len() > limit {
        return Err(YamlError::TooLarge {
            path: shown(),
            limit,
        });
    }
    let mut text = String::new();
    file.take(limit + 1).read_to_string(&mut text).map_err(io)?;
    if text.len() as u64 > limit {
        return Err(YamlError::TooLarge {
            path: shown(),
            limit,
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_nesting_is_refused_fast() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let started = std::time::Instant::now();
        let e = from_str::<serde_json::Value>(&deep).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{e}");
        let block: String = (0..200)
            .map(|i| format!("{}- \n", "  ".repeat(i)))
            .collect();
        assert!(from_str::<serde_json::Value>(&block).is_err());
    }

    /// A billion laughs: nine anchors, each nine aliases of the one
    /// before (9^9 scalars once expanded).
    fn alias_bomb() -> String {
        let mut text = String::from("a0: &a0 [lol]\n");
        for i in 1..=9 {
            let prev = format!("*a{}", i - 1);
            text.push_str(&format!("a{i}: &a{i} [{}]\n", vec![prev; 9].join(", ")));
        }
        text.push_str("policies: []\n");
        text
    }

    #[test]
    fn an_alias_bomb_in_configuration_is_refused_within_its_budget() {
        let e = from_str::<serde_json::Value>(&alias_bomb()).unwrap_err();
        assert!(e.to_string().contains("budget"), "{e}");
        // A configuration of the budget's size is read.
        let big: String = (0..MAX_CONFIG_NODES / 3)
            .map(|i| format!("k{i}: v\n"))
            .collect();
        assert!(from_str::<serde_json::Value>(&big).is_ok());
    }

    #[test]
    fn a_parse_error_does_not_quote_the_content() {
        #[derive(Debug, serde::Deserialize)]
        struct Pod {
            #[allow(dead_code)]
            kind: u32,
        }
        let e = documents_redacted::<Pod>("kind: s3cr3t-t0ken\n")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cr3t"), "{e}");
        let e = documents_redacted::<serde_json::Value>("a: [s3cr3t\n")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn only_regular_files_under_the_limit_are_read() {
        assert!(matches!(
            read_file(Path::new("/dev/zero"), 1 << 20),
            Err(YamlError::NotAFile { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'a'; 2048]).unwrap();
        assert!(matches!(
            read_file(&big, 1024),
            Err(YamlError::TooLarge { .. })
        ));
        assert_eq!(read_file(&big, 4096).unwrap().len(), 2048);
    }
}
