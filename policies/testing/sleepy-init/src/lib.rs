//! A policy whose static initialiser (a constructor the component runs
//! before its first export) sleeps for a minute: a blocking WASI clock
//! wait outside any decision's own code. The host must stop it at the
//! decision's deadline. Its decisions, if it ever got to make them, are
//! the default policy's.

use nmo_policy_sdk::*;

extern "C" fn sleep_at_start() {
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[used]
#[unsafe(link_section = ".init_array")]
static SLEEP_AT_START: extern "C" fn() = sleep_at_start;

struct SleepyInit;

impl Policy for SleepyInit {
    fn plan_drain(_m: Maintenance, _node: Node, pods: Vec<Pod>) -> DrainPlan {
        defaults::plan(&pods, defaults::pod_action)
    }

    fn on_failure(m: Maintenance, failure: Failure) -> Verdict {
        defaults::on_failure(&m, &failure)
    }
}

export_policy!(SleepyInit);
