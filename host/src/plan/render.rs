//! The plans as a user reads them: the tables `nmo plan` prints, and what
//! one plan decides otherwise than another.

use super::*;

impl Report {
    /// What this plan decides otherwise than `baseline` (another policy's
    /// plan of the same node), one line a pod (`shop/db-0: evict, wave 0
    /// → surge, wave 1`) and one for the attempt's timeout or concurrency
    /// when they differ; empty when every pod is decided alike.
    pub fn differences(&self, baseline: &Report) -> Vec<String> {
        let decided = |p: &PodPlan| {
            let mut d = format!("{}, wave {}", p.action, p.wave);
            if let Some(g) = p
                .grace_period_seconds
                .filter(|_| matches!(p.action.as_str(), "evict" | "delete"))
            {
                d.push_str(&format!(", grace {g}s"));
            }
            d
        };
        let mut out = Vec::new();
        if self.attempt_timeout_seconds != baseline.attempt_timeout_seconds
            || self.max_concurrent_removals != baseline.max_concurrent_removals
        {
            out.push(format!(
                "attempt: {}s, {} removal(s) at once → {}s, {} at once",
                baseline.attempt_timeout_seconds,
                baseline.max_concurrent_removals,
                self.attempt_timeout_seconds,
                self.max_concurrent_removals
            ));
        }
        for pod in &self.pods {
            let was = baseline
                .pods
                .iter()
                .find(|b| b.namespace == pod.namespace && b.name == pod.name);
            let now = decided(pod);
            let before = was.map_or_else(|| "(not planned)".to_owned(), decided);
            if now != before {
                let why = pod
                    .reason
                    .as_deref()
                    .or(pod.detail.as_deref())
                    .map(|r| format!(" ({})", crate::text::clean(r, 120)))
                    .unwrap_or_default();
                out.push(format!(
                    "{}/{}: {before} → {now}{why}",
                    pod.namespace, pod.name
                ));
            }
        }
        out
    }

    /// The table `nmo plan` prints by default.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "Node:        {}", self.node);
        if let Some(m) = &self.maintenance {
            let _ = writeln!(
                out,
                "Maintenance: {} ({}, {} pod(s) pending)",
                m.name,
                m.phase.as_deref().unwrap_or("not started"),
                m.pending_pods.len()
            );
        }
        let _ = writeln!(
            out,
            "Policy:      {} (sha256 {}), chosen by {}; from {}",
            self.policy.name,
            &self.policy.digest[..self.policy.digest.len().min(12)],
            self.policy.chosen_by,
            self.policy.source
        );
        let _ = writeln!(
            out,
            "Attempt:     {} per attempt, {} removal(s) at once{}",
            crate::text::duration(std::time::Duration::from_secs_f64(
                self.attempt_timeout_seconds
            )),
            self.max_concurrent_removals,
            if self.policy_concurrency_limit.is_some() {
                " (the policy's limit)"
            } else {
                " (no policy limit)"
            }
        );
        let _ = writeln!(out, "Admission:   {}", self.admission);
        let s = &self.summary;
        let _ = writeln!(
            out,
            "Summary:     {} evict, {} delete, {} skip, {} block{}, in {} wave(s); {} eviction(s) a budget would refuse now\n",
            s.evict,
            s.delete,
            s.skip,
            s.block,
            [("surge", s.surge), ("notify", s.notify), ("wait", s.wait)]
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(w, n)| format!(", {n} {w}"))
                .collect::<String>(),
            s.waves,
            s.refused_now
        );
        let rows: Vec<[String; 7]> = self
            .pods
            .iter()
            .map(|p| {
                let pdb = p
                    .pdbs
                    .iter()
                    .map(|b| format!("{} (allows {})", b.name, b.disruptions_allowed))
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut note = match (&p.reason, &p.detail) {
                    (Some(r), Some(d)) => format!("{d} ({r})"),
                    (r, d) => d.clone().or(r.clone()).unwrap_or_default(),
                };
                if p.refused_now {
                    note = if p.pdbs.len() > 1 {
                        "refused now: more than one budget covers it".into()
                    } else if p.pdbs.iter().all(|b| b.disruptions_allowed <= 0) {
                        "refused now: its budget allows no disruption".into()
                    } else {
                        "refused now: the evictions before it spend its budget".into()
                    };
                }
                [
                    p.wave.to_string(),
                    p.namespace.clone(),
                    p.name.clone(),
                    p.action.clone(),
                    p.grace_period_seconds
                        .map_or_else(|| "-".into(), |g| format!("{g}s")),
                    if pdb.is_empty() { "-".into() } else { pdb },
                    crate::text::clean(&note, 200),
                ]
            })
            .collect();
        let header = [
            "WAVE",
            "NAMESPACE",
            "POD",
            "ACTION",
            "GRACE",
            "PDB",
            "REASON / NOTE",
        ]
        .map(String::from);
        write_table(&mut out, &header, &rows);
        out
    }
}

impl FleetReport {
    /// The table `nmo plan --fleet` prints.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Fleet:       {} maintenance(s); about {} at {} node(s) at a time",
            self.maintenances.len(),
            crate::text::duration(std::time::Duration::from_secs_f64(self.estimate.seconds)),
            self.estimate.parallel
        );
        // A budget that allows no eviction now holds its pods until it
        // does (a replica comes back, someone relaxes it): no estimate
        // covers that wait.
        let blocked: Vec<String> = self
            .budgets
            .iter()
            .filter(|b| b.disruptions_allowed <= 0 && b.evictions > 0)
            .map(|b| format!("{}/{} ({} eviction(s))", b.namespace, b.name, b.evictions))
            .collect();
        if !blocked.is_empty() {
            let _ = writeln!(
                out,
                "Held:        {} allow(s) no eviction now; the estimate assumes they will, and the drain waits until they do",
                blocked.join(", ")
            );
        }
        let _ = writeln!(out, "Estimate:    {}\n", self.estimate.made_of);
        let rows: Vec<[String; 8]> = self
            .maintenances
            .iter()
            .map(|e| {
                let p = &e.plan;
                [
                    e.order.to_string(),
                    p.maintenance
                        .as_ref()
                        .map_or_else(|| "-".into(), |m| m.name.clone()),
                    p.node.clone(),
                    p.policy.name.clone(),
                    p.summary.waves.to_string(),
                    (p.summary.evict + p.summary.delete + p.summary.surge + p.summary.notify)
                        .to_string(),
                    e.refused_across_fleet.to_string(),
                    crate::text::clean(&p.admission, 120),
                ]
            })
            .collect();
        let header = [
            "ORDER",
            "MAINTENANCE",
            "NODE",
            "POLICY",
            "WAVES",
            "REMOVALS",
            "REFUSED",
            "ADMISSION",
        ]
        .map(String::from);
        write_table(&mut out, &header, &rows);
        if !self.budgets.is_empty() {
            let _ = writeln!(out);
            let rows: Vec<[String; 4]> = self
                .budgets
                .iter()
                .map(|b| {
                    [
                        format!("{}/{}", b.namespace, b.name),
                        b.disruptions_allowed.to_string(),
                        b.evictions.to_string(),
                        b.runs_out_at.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            let header = ["BUDGET", "ALLOWS", "EVICTIONS", "RUNS OUT AT"].map(String::from);
            write_table(&mut out, &header, &rows);
        }
        for m in &self.missing_nodes {
            let _ = writeln!(
                out,
                "\nNot planned: {} names node {:?}, which does not exist (the operator fails it; delete it)",
                m.maintenance, m.node
            );
        }
        out
    }
}

/// Columns padded to their widest cell.
fn write_table<const N: usize>(out: &mut String, header: &[String; N], rows: &[[String; N]]) {
    use std::fmt::Write;
    let widths: Vec<usize> = (0..N)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in std::iter::once(header).chain(rows.iter()) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}
