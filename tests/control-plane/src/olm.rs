//! The Operator Lifecycle Manager (OLM v0) beside the control plane: its
//! olm and catalog operators as processes, a file-based catalog served by
//! opm, the images its bundle unpack Job runs, and a test's own registry
//! the real nodes pull bundle images from.

use std::path::{Path, PathBuf};

use crate::process::Process;
use crate::{Binaries, ControlPlane, ControlPlaneError, scratch_image_with};

/// OLM's own namespace (its global catalogs).
pub const OLM_NAMESPACE: &str = "olm";
/// The image OLM's unpack Job copies `cpb` from (`/bin/cp -Rv /bin/cpb
/// /util/cpb`): OLM's cpb, and busybox's `cp`.
pub const OLM_UTIL_IMAGE: &str = "localhost/olm-util:test";
/// The image OLM's unpack Job runs `opm alpha bundle extract` in.
pub const OLM_OPM_IMAGE: &str = "localhost/olm-opm:test";

/// Where busybox-static puts its one static binary (the util image's
/// `cp`).
const BUSYBOX: &str = "/bin/busybox";

/// Writes into `dir` the OCI archives of [`OLM_UTIL_IMAGE`] and
/// [`OLM_OPM_IMAGE`], `FROM scratch` with the control plane's static
/// builds (and busybox-static's `cp`), for [`Options::images`](crate::Options::images): OLM's
/// release ships them as images of its own registry, which cannot be
/// pulled here.
pub fn olm_images(bin: &Binaries, dir: &Path) -> Result<Vec<PathBuf>, ControlPlaneError> {
    if !Path::new(BUSYBOX).exists() {
        return Err(ControlPlaneError::Node(format!(
            "{BUSYBOX} not found: OLM's util image takes its cp from busybox-static \
             (apt-get install busybox-static)"
        )));
    }
    let busybox: &[(&Path, &str)] = &[(Path::new(BUSYBOX), "/bin/cp")];
    // (archive, binary of the build, image, the binary's path, more files)
    let images = [
        ("olm-util.tar", "cpb", OLM_UTIL_IMAGE, "/bin/cpb", busybox),
        ("olm-opm.tar", "opm", OLM_OPM_IMAGE, "/bin/opm", &[]),
    ];
    images
        .into_iter()
        .map(|(archive, binary, name, at, files)| {
            let out = dir.join(archive);
            scratch_image_with(&bin.path(binary), &out, name, at, "65532:65532", files)?;
            Ok(out)
        })
        .collect()
}

impl ControlPlane {
    /// Starts the Operator Lifecycle Manager (OLM v0) as its release runs
    /// it, one process per operator: its CRDs, its `olm` namespace, the olm
    /// operator (ClusterServiceVersions, OperatorGroups, an install
    /// strategy's Deployment and RBAC, a webhook's certificate and
    /// registration) and the catalog operator (CatalogSources,
    /// Subscriptions, InstallPlans; a bundle referenced by image unpacked
    /// by a Job with [`OLM_UTIL_IMAGE`] and [`OLM_OPM_IMAGE`], which
    /// [`olm_images`] makes for
    /// [`Options::images`](crate::Options::images)). No ClusterOperator
    /// status (that is OpenShift's). Both serve their health on :8080 as in
    /// their pods, so they belong in a test's own network namespace
    /// ([`isolated`](crate::isolated)): the second's health server finds the port taken and
    /// says so in its log, which does not stop it.
    pub async fn start_olm(&mut self) -> Result<(), ControlPlaneError> {
        let path = self.bin.path("olm-crds.yaml");
        let crds = std::fs::read_to_string(&path).map_err(|e| ControlPlaneError::io(&path, e))?;
        self.apply(&crds).await?;
        self.kubectl(&["create", "namespace", OLM_NAMESPACE], None)
            .await?;
        let kc = self.kubeconfig_path();
        let olm = Process::spawn_with_env(
            "olm",
            &self.bin.path("olm"),
            &[
                format!("--namespace={OLM_NAMESPACE}"),
                "--writeStatusName=".to_owned(),
                "--writePackageServerStatusName=".to_owned(),
            ],
            &[("KUBECONFIG", &kc)],
            self.dir.path(),
        )?;
        self.processes.push(olm);
        let catalog = Process::spawn(
            "catalog",
            &self.bin.path("catalog"),
            &[
                format!("--kubeconfig={}", kc.display()),
                format!("--namespace={OLM_NAMESPACE}"),
                "--writeStatusName=".to_owned(),
                format!("--util-image={OLM_UTIL_IMAGE}"),
                format!("--opmImage={OLM_OPM_IMAGE}"),
            ],
            self.dir.path(),
        )?;
        self.processes.push(catalog);
        Ok(())
    }

    /// Serves the file-based catalog in folder `configs` with
    /// operator-registry's `opm serve` (its gRPC registry API, what a
    /// catalog image runs), and returns its address for a CatalogSource's
    /// `spec.address`. It listens on every address of the network
    /// namespace (opm takes a port only): run it in [`isolated`](crate::isolated).
    pub async fn serve_catalog(&mut self, configs: &Path) -> Result<String, ControlPlaneError> {
        let dir = self.dir.path().to_owned();
        let ports = self
            .spawn_listening("opm", 2, |p| {
                vec![
                    "serve".to_owned(),
                    configs.display().to_string(),
                    format!("--port={}", p[0]),
                    format!("--pprof-addr=127.0.0.1:{}", p[1]),
                    // Its cache in the control plane's folder, built at
                    // start (there is none made beforehand to check).
                    format!(
                        "--cache-dir={}",
                        dir.join(format!("opm-cache-{}", p[0])).display()
                    ),
                    "--cache-enforce-integrity=false".to_owned(),
                    format!(
                        "--termination-log={}",
                        dir.join("opm.termination").display()
                    ),
                ]
            })
            .await?;
        Ok(format!("127.0.0.1:{}", ports[0]))
    }

    /// Lets the real nodes pull from the plain-HTTP registry at `host`
    /// (a test's own, in its network namespace), as a cluster's nodes are
    /// given a registry of their own.
    pub fn trust_registry(&self, host: &str) -> Result<(), ControlPlaneError> {
        match &self.real {
            Some(r) => r.trust_registry(host),
            None => Err(ControlPlaneError::Node(
                "no real node to pull from a registry".into(),
            )),
        }
    }
}
