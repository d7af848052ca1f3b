//! The host bindings, generated from the WIT packages: the contract this
//! runtime implements (`wit/`), and contract 0.3.0 (`runtime/wit-compat`),
//! which 0.4 extends: only its `types` interface is linked, answered by the
//! 0.4 host's own accessors on the same resources, so a 0.3 policy loads
//! and sees what it always saw.
#![allow(missing_docs, clippy::all)]

wasmtime::component::bindgen!({
    path: "../wit",
    world: "drain-policy",
    // The decisions run under the engine's async support (the deadline's
    // timer, WASI's sleeps); the imports answer at once.
    exports: { default: async },
});

/// Contract 0.3.0's bindings.
pub(crate) mod v0_3 {
    wasmtime::component::bindgen!({
        path: "wit-compat/node-maintenance-0.3.0.wit",
        world: "drain-policy",
        exports: { default: async },
        with: {
            "medik8s:node-maintenance/types.pod": crate::bindings::medik8s::node_maintenance::types::Pod,
            "medik8s:node-maintenance/types.node": crate::bindings::medik8s::node_maintenance::types::Node,
        },
    });
}

/// The records a policy receives and answers with, as generated from the WIT
/// package.
pub mod types {
    pub use super::medik8s::node_maintenance::types::*;
}
