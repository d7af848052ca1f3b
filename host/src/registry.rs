//! The operator's metrics registry as `/metrics` serves it: the process's
//! families and each component's own, registered on one registry. The
//! binary makes it at start and hands each component its part.

use prometheus::Registry;

use crate::client::ClientMetrics;
use crate::controller::ControllerMetrics;
use crate::metrics;
use crate::policy::PolicyMetrics;
use crate::webhook::WebhookMetrics;

/// Every component's metrics, on one registry. Cheap to clone.
#[derive(Clone, Debug)]
pub struct OperatorMetrics {
    /// What `/metrics` serves.
    pub registry: Registry,
    pub controller: ControllerMetrics,
    pub policy: PolicyMetrics,
    pub webhook: WebhookMetrics,
    pub client: ClientMetrics,
}

impl OperatorMetrics {
    /// A new registry with every family registered, each bounded series at
    /// 0 from the start.
    pub fn register() -> metrics::Result<Self> {
        let registry = Registry::new();
        metrics::register_process(&registry)?;
        Ok(OperatorMetrics {
            controller: ControllerMetrics::register(&registry)?,
            policy: PolicyMetrics::register(&registry)?,
            webhook: WebhookMetrics::register(&registry)?,
            client: ClientMetrics::register(&registry)?,
            registry,
        })
    }

    /// The text exposition of every family.
    pub fn render(&self) -> metrics::Result<String> {
        metrics::render(&self.registry)
    }
}
