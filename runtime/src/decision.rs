//! The decisions a policy makes: the functions the WIT world exports, one
//! name each for calls, metrics, errors and messages, and the one way the
//! operator asks for one from async code.

/// A function of the `drain-policy` world the host calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// `validate-settings`: whether the policy accepts its settings.
    ValidateSettings,
    /// `admit`: whether a maintenance may start now.
    Admit,
    /// `plan-drain`: how to drain a node.
    PlanDrain,
    /// `on-failure`: what to do after a failed attempt.
    OnFailure,
}

impl Decision {
    /// Every decision, in the WIT's order.
    pub const ALL: [Decision; 4] = [
        Decision::ValidateSettings,
        Decision::Admit,
        Decision::PlanDrain,
        Decision::OnFailure,
    ];

    /// The WIT function's name (the `function` label of the policy
    /// metrics, and what errors say).
    pub const fn name(self) -> &'static str {
        match self {
            Decision::ValidateSettings => "validate-settings",
            Decision::Admit => "admit",
            Decision::PlanDrain => "plan-drain",
            Decision::OnFailure => "on-failure",
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `call` (one decision of a [`Policy`](crate::engine::Policy)) on the
/// blocking pool and waits for it: a decision is CPU work of up to the
/// policy's deadline, and WASI's synchronous streams must not run on an
/// async worker. The controller, the webhook and `nmo plan` all ask
/// through here.
pub async fn decide<T: Send + 'static>(
    decision: Decision,
    call: impl FnOnce() -> crate::error::Result<T> + Send + 'static,
) -> crate::error::Result<T> {
    tokio::task::spawn_blocking(call).await.map_err(|e| {
        crate::error::Error::Engine(format!("the policy's {decision} call did not finish: {e}"))
    })?
}
