//! Prometheus metrics: what every component's metrics are made with.
//!
//! The binary makes one [`Registry`] and hands it to each component, which
//! registers its own families on it and keeps them in a struct of its own
//! (`controller::ControllerMetrics`, `policy::PolicyMetrics`,
//! `webhook::WebhookMetrics`, `client::ClientMetrics`), as controller-rs's
//! `register` and linkerd's sub-registries do. Names are controller-runtime's
//! and client-go's where the Go operator has them (so its dashboards keep
//! working), our own `nmo_*` otherwise. Every label is bounded: its values
//! come from a [`Label`] enum, a fixed list, or the cluster's own objects.

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// What can go wrong making or serving the metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A family could not be made or registered (a bad name, or registered
    /// twice on one registry).
    #[error("metric {name}: {source}")]
    Family {
        name: &'static str,
        #[source]
        source: prometheus::Error,
    },
    /// The text exposition could not be written.
    #[error("encoding the metrics: {0}")]
    Encode(#[source] prometheus::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A label whose values are a fixed set: one enum variant each.
pub trait Label: Copy + 'static {
    /// Every value, so each series exists (at 0) from the start.
    const ALL: &'static [Self];
    /// The label value.
    fn as_str(self) -> &'static str;
}

fn family(name: &'static str) -> impl FnOnce(prometheus::Error) -> Error {
    move |source| Error::Family { name, source }
}

/// Registers `collector` on `registry` and gives it back.
fn register<C: Collector + Clone + 'static>(
    registry: &Registry,
    name: &'static str,
    collector: C,
) -> Result<C> {
    registry
        .register(Box::new(collector.clone()))
        .map_err(family(name))?;
    Ok(collector)
}

/// An `IntCounterVec` registered on `registry`.
pub(crate) fn counter_vec(
    registry: &Registry,
    name: &'static str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels).map_err(family(name))?;
    register(registry, name, c)
}

/// An `IntGaugeVec` registered on `registry`.
pub(crate) fn gauge_vec(
    registry: &Registry,
    name: &'static str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).map_err(family(name))?;
    register(registry, name, g)
}

/// An `IntGauge` registered on `registry`.
pub(crate) fn gauge(registry: &Registry, name: &'static str, help: &str) -> Result<IntGauge> {
    let g = IntGauge::new(name, help).map_err(family(name))?;
    register(registry, name, g)
}

/// A `HistogramVec` with `buckets`, registered on `registry`.
pub(crate) fn histogram_vec(
    registry: &Registry,
    name: &'static str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> Result<HistogramVec> {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .map_err(family(name))?;
    register(registry, name, h)
}

/// A `Histogram` with `buckets`, registered on `registry`.
pub fn histogram(
    registry: &Registry,
    name: &'static str,
    help: &str,
    buckets: Vec<f64>,
) -> Result<Histogram> {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .map_err(family(name))?;
    register(registry, name, h)
}

/// `n` bucket bounds from `start`, each `factor` times the one before.
pub(crate) fn exponential(start: f64, factor: f64, n: usize) -> Vec<f64> {
    std::iter::successors(Some(start), |b| Some(b * factor))
        .take(n)
        .collect()
}

/// The process's own families: `nmo_build_info`, and on Linux
/// `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, `process_start_time_seconds`…, as client_golang's.
pub(crate) fn register_process(registry: &Registry) -> Result<()> {
    let build_info = gauge_vec(
        registry,
        "nmo_build_info",
        "Build information; the value is always 1.",
        &["version"],
    )?;
    build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .map_err(family("process_*"))?;
    Ok(())
}

/// The registry in the text exposition format.
pub fn render(registry: &Registry) -> Result<String> {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .map_err(Error::Encode)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A family registered twice on one registry is an error naming it,
    /// not a panic.
    #[test]
    fn a_family_registered_twice_is_an_error_naming_it() {
        let registry = Registry::new();
        gauge(&registry, "nmo_twice", "once").unwrap();
        let e = gauge(&registry, "nmo_twice", "twice").unwrap_err();
        assert!(e.to_string().starts_with("metric nmo_twice:"), "{e}");
    }

    #[test]
    fn exponential_buckets_grow_by_their_factor() {
        assert_eq!(exponential(0.5, 2.0, 4), vec![0.5, 1.0, 2.0, 4.0]);
    }

    #[test]
    fn the_process_families_are_served() {
        let registry = Registry::new();
        register_process(&registry).unwrap();
        let text = render(&registry).unwrap();
        assert!(text.contains("nmo_build_info{version="), "{text}");
        #[cfg(target_os = "linux")]
        assert!(text.contains("process_resident_memory_bytes"), "{text}");
    }
}
