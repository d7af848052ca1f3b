//! A policy's settings: the `settings` of its entry in `policies.yaml`.

use crate::*;

use crate::bindings::medik8s::node_maintenance::types::KeyValue;

/// A policy's settings: the `settings` of its entry in `policies.yaml`,
/// values as strings, sorted by key.
#[derive(Clone, Debug, Default)]
pub struct Settings(Vec<KeyValue>);

impl Settings {
    /// Settings from the contract's list.
    pub fn new(pairs: Vec<KeyValue>) -> Self {
        Settings(pairs)
    }

    /// The settings the operator gives this decision (checked by
    /// [`Policy::validate_settings`] when the policy set was loaded).
    ///
    /// Outside WebAssembly: those set by [`testing::set_settings`] on this
    /// thread.
    pub fn current() -> Self {
        #[cfg(target_family = "wasm")]
        return Settings(bindings::settings());
        #[cfg(not(target_family = "wasm"))]
        return testing::current_settings();
    }

    /// One setting's value.
    pub fn get(&self, key: &str) -> Option<&str> {
        lookup(&self.0, key)
    }

    /// Every setting.
    pub fn pairs(&self) -> &[KeyValue] {
        &self.0
    }

    /// An error naming the first setting not in `known` (a typo would
    /// otherwise be ignored).
    pub fn allow_only(&self, known: &[&str]) -> Result<(), String> {
        match self.0.iter().find(|kv| !known.contains(&kv.key.as_str())) {
            None => Ok(()),
            Some(kv) if known.is_empty() => Err(format!(
                "unknown setting {:?}: this policy takes no settings",
                kv.key
            )),
            Some(kv) => Err(format!(
                "unknown setting {:?} (known: {})",
                kv.key,
                known.join(", ")
            )),
        }
    }

    /// A duration setting (`90s`, `15m`, `2h`): `Ok(None)` when absent, an
    /// error naming the setting when it cannot be read.
    pub fn duration_ms(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => duration_ms(v).map(Some).ok_or_else(|| {
                format!("setting {key}: cannot read {v:?} as a duration (use 90s, 15m, 2h)")
            }),
        }
    }

    /// A whole-number setting: `Ok(None)` when absent.
    pub fn number(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("setting {key}: {v:?} is not a whole number")),
        }
    }
}
