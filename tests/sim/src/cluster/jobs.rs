//! The Job controller: pods until the completions succeed.

use super::*;

pub(super) fn jobs(sim: &Sim) {
    let (jobs, by_owner) = workloads_and_pods(&sim.store(), "jobs.batch");
    let pods_rt = pods_type(sim);
    for job in jobs {
        if is_terminating(&job) {
            continue;
        }
        let uid = job["metadata"]["uid"].as_str().unwrap_or_default();
        let ns = job["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = job["metadata"]["name"].as_str().unwrap_or_default();
        let empty = Vec::new();
        let owned = by_owner.get(uid).unwrap_or(&empty);
        let succeeded = owned
            .iter()
            .filter(|p| p["status"]["phase"] == "Succeeded")
            .count() as i64;
        let act = active(owned).len() as i64;
        let completions = job["spec"]["completions"].as_i64().unwrap_or(1);
        let parallelism = job["spec"]["parallelism"].as_i64().unwrap_or(1);
        let complete = succeeded >= completions;
        if !complete {
            let want = parallelism.min(completions - succeeded);
            for _ in act..want {
                let pod = pod_from_template(
                    &job,
                    &job["spec"]["template"],
                    owner_ref(&job, "batch/v1", "Job"),
                    None,
                    &[
                        ("batch.kubernetes.io/job-name", name.to_owned()),
                        ("job-name", name.to_owned()),
                        ("batch.kubernetes.io/controller-uid", uid.to_owned()),
                        ("controller-uid", uid.to_owned()),
                    ],
                );
                let _ = sim.create(&pods_rt, Some(ns), pod, false);
            }
        }
        let mut status = json!({"active": act, "succeeded": succeeded, "ready": owned.iter().filter(|p| is_ready(p)).count()});
        if complete {
            status["conditions"] = json!([{"type": "Complete", "status": "True"}]);
            status["completionTime"] = job["status"]["completionTime"]
                .as_str()
                .map_or_else(|| json!(now_rfc3339()), |t| json!(t));
        }
        status["startTime"] = job["status"]["startTime"]
            .as_str()
            .map_or_else(|| json!(now_rfc3339()), |t| json!(t));
        set_status(sim, "jobs.batch", &job, status);
    }
}
