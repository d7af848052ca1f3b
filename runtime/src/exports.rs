//! A policy's exports, bound by the contract version it was built
//! against: one binding per published contract behind one enum, each
//! older one converting its inputs down and its answers up to the current
//! contract's types. A new contract version may add or change an export:
//! it gets its own variant here, and the policies of every earlier
//! version keep being called through theirs.
//!
//! Adding a version: generate its bindings (`bindings.rs`), link what
//! its imports need (`compat.rs` for 0.3's `types`), add a variant to
//! [`Bound`] and [`Exports`], and convert its records where they differ
//! from the current ones.

use wasmtime::Store;
use wasmtime::component::{InstancePre, Resource};

use crate::bindings::types::{
    Admission, DrainPlan, Failure, Fleet, KeyValue, Maintenance, Node, Pod, Verdict,
};
use crate::bindings::{DrainPolicy, DrainPolicyPre, v0_3};
use crate::compat::To;
use crate::inputs::HostState;

/// A policy's exports, pre-linked, as its contract version has them.
pub(crate) enum Bound {
    /// The current contract (0.4).
    Current(DrainPolicyPre<HostState>),
    /// Contract 0.3: the same exports, its own record types.
    V0_3(v0_3::DrainPolicyPre<HostState>),
}

/// One instance of a policy's exports (one decision's).
pub(crate) enum Exports {
    Current(DrainPolicy),
    V0_3(v0_3::DrainPolicy),
}

impl Bound {
    /// Binds the exports of the contract version `contract` (as the
    /// component's interface names give it; the current one when none).
    pub(crate) fn new(
        pre: InstancePre<HostState>,
        contract: Option<&str>,
    ) -> wasmtime::Result<Bound> {
        Ok(match contract {
            Some(v) if crate::engine::same_minor(v, "0.3.0") => {
                Bound::V0_3(v0_3::DrainPolicyPre::new(pre)?)
            }
            _ => Bound::Current(DrainPolicyPre::new(pre)?),
        })
    }

    pub(crate) fn instance_pre(&self) -> &InstancePre<HostState> {
        match self {
            Bound::Current(p) => p.instance_pre(),
            Bound::V0_3(p) => p.instance_pre(),
        }
    }

    pub(crate) async fn instantiate(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Exports> {
        Ok(match self {
            Bound::Current(p) => Exports::Current(p.instantiate_async(store).await?),
            Bound::V0_3(p) => Exports::V0_3(p.instantiate_async(store).await?),
        })
    }
}

impl Exports {
    pub(crate) async fn validate_settings(
        &self,
        store: &mut Store<HostState>,
        settings: &[KeyValue],
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            Exports::Current(p) => p.call_validate_settings(store, settings).await,
            Exports::V0_3(p) => {
                let settings: Vec<_> = settings.to_vec().to();
                p.call_validate_settings(store, &settings).await
            }
        }
    }

    pub(crate) async fn admit(
        &self,
        store: &mut Store<HostState>,
        maintenance: &Maintenance,
        node: Resource<Node>,
        fleet: Fleet,
    ) -> wasmtime::Result<Admission> {
        match self {
            Exports::Current(p) => p.call_admit(store, maintenance, node, &fleet).await,
            Exports::V0_3(p) => {
                let (m, f) = (maintenance.clone().to(), fleet.to());
                Ok(p.call_admit(store, &m, node, &f).await?.to())
            }
        }
    }

    pub(crate) async fn plan_drain(
        &self,
        store: &mut Store<HostState>,
        maintenance: &Maintenance,
        node: Resource<Node>,
        pods: &[Resource<Pod>],
    ) -> wasmtime::Result<DrainPlan> {
        match self {
            Exports::Current(p) => p.call_plan_drain(store, maintenance, node, pods).await,
            Exports::V0_3(p) => {
                let m = maintenance.clone().to();
                Ok(p.call_plan_drain(store, &m, node, pods).await?.to())
            }
        }
    }

    pub(crate) async fn on_failure(
        &self,
        store: &mut Store<HostState>,
        maintenance: &Maintenance,
        failure: &Failure,
    ) -> wasmtime::Result<Verdict> {
        match self {
            Exports::Current(p) => p.call_on_failure(store, maintenance, failure).await,
            Exports::V0_3(p) => {
                let (m, f) = (maintenance.clone().to(), failure.clone().to());
                Ok(p.call_on_failure(store, &m, &f).await?.to())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A test-only contract 0.5 whose world adds an export (`describe`).
    mod v0_5 {
        wasmtime::component::bindgen!({
            inline: r#"
                package medik8s:node-maintenance@0.5.0;
                world drain-policy {
                    export describe: func() -> string;
                }
            "#,
            exports: { default: async },
        });
    }

    /// A contract that adds an export cannot call the policies of the
    /// earlier ones through its own binding (they lack the export);
    /// bound by their own version, they go on deciding.
    #[test]
    fn a_new_export_leaves_the_policies_of_earlier_contracts_deciding() {
        let engine = crate::PolicyEngine::new(crate::EngineConfig::default()).unwrap();
        let policy = engine.default_policy().unwrap();
        assert!(matches!(policy.bound(), super::Bound::Current(_)));
        let pre = policy.bound().instance_pre().clone();
        let err = v0_5::DrainPolicyPre::new(pre)
            .err()
            .expect("a 0.4 policy has no 0.5 export");
        assert!(format!("{err:#}").contains("describe"), "{err:#}");
        crate::selfcheck::run(&policy).expect("the 0.4 policy decides through its own binding");
    }
}
