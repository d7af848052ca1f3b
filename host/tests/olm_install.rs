//! The OLM bundle (`deploy/olm`) installed as a user installs it, by a
//! real OLM (v0: its olm and catalog operators, built with the control
//! plane and run beside it), the operator then running as its pods on a
//! real node from the image built here:
//! - from the catalog `deploy/olm/catalog.sh` makes with the real opm
//!   (the manifests inline), served by `opm serve`, through
//!   `deploy/olm/subscription.yaml`; and uninstalled as OLM uninstalls;
//! - from a catalog that references the bundle by its image (built from
//!   `deploy/olm/bundle.Dockerfile`, pushed to a registry): OLM's unpack
//!   Job runs on the real node, which pulls the bundle image from that
//!   registry.
//!
//! Everything runs in the test's own network namespace
//! (`nmo_control_plane::isolated`), the registry and the catalog server
//! on its loopback.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use nmo_control_plane::{ControlPlane, OLM_NAMESPACE, isolated};
use serde_json::{Value, json};

use crate::common;
use crate::olm::{PACKAGE, VERSION, bundle_dir};
use crate::real_node::{self, KWOK, REAL, kubectl_ok};

/// The image the real-node tests import (`deploy/image/build.sh`), as a
/// user's catalog names it.
const OPERATOR_IMAGE: &str = "localhost/nmo:dev";
const INSTALL_NS: &str = "node-maintenance-operator-system";

/// Runs `program` with `args` (and `path` first on the PATH, if any),
/// failing with what it printed; returns its standard output.
fn run(program: &Path, args: &[&str], path: Option<&Path>) -> String {
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    if let Some(dir) = path {
        let rest = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{rest}", dir.display()));
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        common::printed(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// buildah with its storage under `root` (nothing system-wide).
fn buildah(root: &Path, args: &[&str]) -> String {
    let mut all = vec![
        format!("--root={}", root.join("storage").display()),
        format!("--runroot={}", root.join("run").display()),
        "--storage-driver=vfs".to_owned(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    run(
        Path::new("buildah"),
        &all.iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    )
}

/// Builds the bundle image from `deploy/olm/bundle.Dockerfile` as `tag`,
/// from a copy of `deploy/olm` whose CSV runs `image` (the install guide:
/// point it at yours before building the bundle image), or as shipped.
fn build_bundle_image(root: &Path, tag: &str, image: Option<&str>) {
    let context = root.join("olm");
    for sub in ["bundle/manifests", "bundle/metadata"] {
        std::fs::create_dir_all(context.join(sub)).unwrap();
        for f in std::fs::read_dir(bundle_dir().join("..").join(sub)).unwrap() {
            let f = f.unwrap().path();
            let mut text = std::fs::read_to_string(&f).unwrap();
            if let Some(image) = image {
                text = text.replace("nmo:latest", image);
            }
            std::fs::write(context.join(sub).join(f.file_name().unwrap()), text).unwrap();
        }
    }
    let dockerfile = bundle_dir().join("../bundle.Dockerfile");
    buildah(
        root,
        &[
            "bud",
            "--quiet",
            "--layers=false",
            "-f",
            &dockerfile.display().to_string(),
            "-t",
            tag,
            &context.display().to_string(),
        ],
    );
}

/// Pushes `tag` from buildah's storage under `root` to `reference` (a
/// plain-HTTP registry).
fn push(root: &Path, tag: &str, reference: &str) {
    buildah(
        root,
        &[
            "push",
            "--quiet",
            "--tls-verify=false",
            tag,
            &format!("docker://{reference}"),
        ],
    );
}

/// The catalog a user makes of the bundle folder, as the install guide
/// has it: `deploy/olm/catalog.sh` with the image, run with the control
/// plane's real opm on the PATH (it renders the bundle with its manifests
/// inline, adds the package and its channel, and runs `opm validate`).
/// Returns the catalog's folder.
fn catalog_of_folder(cp: &ControlPlane, work: &Path) -> PathBuf {
    let configs = work.join("catalog");
    run(
        &bundle_dir().join("../catalog.sh"),
        &[OPERATOR_IMAGE, &configs.display().to_string()],
        Some(cp.binaries().dir()),
    );
    configs
}

/// A catalog that references the bundle by `reference` (an image in a
/// plain-HTTP registry), as catalog tools make one: `opm render` of the
/// image, the package and its channel, `opm validate`.
fn catalog_of_image(cp: &ControlPlane, work: &Path, reference: &str) -> PathBuf {
    let opm = cp.binaries().path("opm");
    let package = run(
        &opm,
        &["init", PACKAGE, "--default-channel=stable", "-o", "yaml"],
        None,
    );
    let bundle = run(
        &opm,
        &["render", reference, "--use-http", "-o", "yaml"],
        None,
    );
    assert!(
        bundle.contains(&format!("image: {reference}")),
        "the bundle is referenced by its image: {bundle}"
    );
    let channel = format!(
        "---\nschema: olm.channel\npackage: {PACKAGE}\nname: stable\n\
         entries:\n- name: {PACKAGE}.v{VERSION}\n"
    );
    let configs = work.join("catalog");
    std::fs::create_dir_all(&configs).unwrap();
    std::fs::write(
        configs.join("index.yaml"),
        format!("{package}{bundle}{channel}"),
    )
    .unwrap();
    run(&opm, &["validate", &configs.display().to_string()], None);
    configs
}

/// What a user applies to install from a catalog served at `address`: the
/// CatalogSource (OLM's `grpc` source at an address: no registry pod of
/// its own), then `deploy/olm/subscription.yaml` as shipped (the leases'
/// namespace, the operator's namespace with an OperatorGroup for all
/// namespaces, the Subscription).
fn subscription(address: &str) -> String {
    let shipped = std::fs::read_to_string(bundle_dir().join("../subscription.yaml")).unwrap();
    format!(
        "apiVersion: operators.coreos.com/v1alpha1\nkind: CatalogSource\n\
         metadata: {{name: nmo-catalog, namespace: {OLM_NAMESPACE}}}\n\
         spec: {{sourceType: grpc, address: '{address}', displayName: nmo}}\n---\n{shipped}"
    )
}

/// `kubectl get ARGS -o jsonpath=PATH` as the admin, if it answers.
async fn jsonpath(kubeconfig: &Path, args: &[&str], path: &str) -> Option<String> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    let path = format!("jsonpath={path}");
    all.extend(["-o", &path]);
    match nmo_control_plane::kubectl_with(kubeconfig, &all, None).await {
        Ok((true, out)) => Some(out.trim().to_owned()),
        _ => None,
    }
}

/// Installs the operator from the catalog at `address` as a user does and
/// checks what they would: the CSV Succeeded, the InstallPlan Complete,
/// both replicas Ready on the real node from the image built here, the
/// webhook registered by OLM with its CA and called through the Service
/// (a duplicate refused), a maintenance of a kwok node Succeeded and,
/// deleted, the node given back.
async fn installs_and_maintains(cp: &mut ControlPlane, address: &str, begun: Instant) {
    kubectl_ok(cp, &["apply", "-f", "-"], Some(&subscription(address))).await;
    let kubeconfig = cp.kubeconfig_path();
    let csv = format!("{PACKAGE}.v{VERSION}");
    let succeeded = cp
        .wait_for(
            "the CSV Succeeded (OLM resolved, planned and installed it)",
            Duration::from_secs(240),
            || async {
                jsonpath(
                    &kubeconfig,
                    &["csv", &csv, "-n", INSTALL_NS],
                    "{.status.phase}",
                )
                .await
                .as_deref()
                    == Some("Succeeded")
            },
        )
        .await;
    if let Err(e) = succeeded {
        let state = cp
            .kubectl(
                &[
                    "get",
                    "catalogsource,subscription,installplan,csv,job,deployment,pods",
                    "-A",
                    "-o",
                    "yaml",
                ],
                None,
            )
            .await
            .unwrap_or_else(|e| e.to_string());
        panic!("{e}\n{state}\n{}", cp.logs_tail(30));
    }
    eprintln!("OLM: the CSV Succeeded after {:?}", begun.elapsed());
    let plan = jsonpath(
        &kubeconfig,
        &["installplan", "-n", INSTALL_NS],
        "{.items[*].status.phase}",
    )
    .await;
    assert_eq!(plan.as_deref(), Some("Complete"), "the InstallPlan");

    let pods = real_node::replicas_ready(cp, INSTALL_NS, 2).await;
    assert_eq!(pods.len(), 2, "{pods:?}");
    for p in &pods {
        assert_eq!(
            p.spec.as_ref().unwrap().node_name.as_deref(),
            Some(REAL),
            "{:?}",
            p.metadata.name
        );
        let c = &p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        assert_eq!(c.image, OPERATOR_IMAGE);
        assert_eq!(c.restart_count, 0, "{c:?}");
    }
    let ca = jsonpath(
        &kubeconfig,
        &[
            "validatingwebhookconfigurations",
            "-l",
            &format!("olm.owner={csv}"),
        ],
        "{.items[*].webhooks[*].clientConfig.caBundle}",
    )
    .await;
    assert!(
        ca.is_some_and(|ca| !ca.is_empty()),
        "OLM registers the webhook with its CA"
    );

    let client = cp.client().await.unwrap();
    kubectl_ok(cp, &["apply", "-f", "-"], Some(&real_node::web_on_kwok())).await;
    real_node::admits_once_through_the_webhook(cp, "nm-olm", KWOK).await;
    cp.wait_for("nm-olm Succeeded", Duration::from_secs(120), || async {
        real_node::cp_phase(&client, "nm-olm").await.as_deref() == Some("Succeeded")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let cordoned = nodes.get(KWOK).await.unwrap();
    assert_eq!(cordoned.spec.unwrap().unschedulable, Some(true));
    eprintln!("OLM: the maintenance Succeeded after {:?}", begun.elapsed());
    kubectl_ok(cp, &["delete", "nodemaintenance", "nm-olm"], None).await;
    cp.wait_for("the node given back", Duration::from_secs(60), || async {
        nodes
            .get(KWOK)
            .await
            .ok()
            .and_then(|n| n.spec)
            .is_some_and(|s| s.unschedulable != Some(true))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// The catalog of `deploy/olm/catalog.sh` (the manifests inline), served
/// by `opm serve`: OLM installs the operator through
/// `deploy/olm/subscription.yaml`; uninstalled as OLM uninstalls (the
/// Subscription and the CSV deleted), the Deployment and the webhook's
/// registration go, the CRD and the maintenances stay.
#[test]
fn a_real_olm_installs_the_bundle_and_the_operator_runs_as_its_pods() {
    let image = crate::image::archive();
    isolated(move || async move {
        let begun = Instant::now();
        let mut cp = real_node::start(&[REAL], image).await;
        cp.start_olm().await.unwrap();
        let work = tempfile::tempdir().unwrap();
        let configs = catalog_of_folder(&cp, work.path());
        let address = cp.serve_catalog(&configs).await.unwrap();
        installs_and_maintains(&mut cp, &address, begun).await;

        kubectl_ok(
            &cp,
            &["create", "-f", "-"],
            Some(&real_node::maintenance("nm-kept", KWOK)),
        )
        .await;
        kubectl_ok(
            &cp,
            &["delete", "subscription,csv", "--all", "-n", INSTALL_NS],
            None,
        )
        .await;
        let kubeconfig = cp.kubeconfig_path();
        let csv = format!("{PACKAGE}.v{VERSION}");
        cp.wait_for(
            "the operator's Deployment and webhook gone with the CSV",
            Duration::from_secs(60),
            || async {
                let deployments = jsonpath(
                    &kubeconfig,
                    &[
                        "deployments",
                        "-A",
                        "-l",
                        "control-plane=controller-manager",
                    ],
                    "{.items[*].metadata.name}",
                )
                .await;
                let webhooks = jsonpath(
                    &kubeconfig,
                    &[
                        "validatingwebhookconfigurations",
                        "-l",
                        &format!("olm.owner={csv}"),
                    ],
                    "{.items[*].metadata.name}",
                )
                .await;
                deployments.is_some_and(|d| d.is_empty()) && webhooks.is_some_and(|w| w.is_empty())
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let kept = kubectl_ok(
            &cp,
            &["get", "nodemaintenance", "nm-kept", "-o", "name"],
            None,
        )
        .await;
        assert_eq!(
            kept.trim(),
            "nodemaintenance.nodemaintenance.medik8s.io/nm-kept"
        );
        cp.stop();
    })
    .unwrap();
}

/// A catalog that references the bundle by its image: the bundle image
/// built from `deploy/olm/bundle.Dockerfile` (the CSV pointed at the
/// operator's image) and pushed to a registry the real node pulls from;
/// OLM unpacks it with its Job on the real node (the bundle image pulled,
/// OLM's cpb and opm run in it) and installs the operator from what the
/// Job read.
#[test]
fn a_real_olm_unpacks_the_bundle_image_the_node_pulls_from_a_registry() {
    let binaries = nmo_control_plane::Binaries::ensure().expect("the control plane's binaries");
    let work = tempfile::tempdir().unwrap();
    let mut images = vec![crate::image::archive()];
    images.extend(nmo_control_plane::olm_images(&binaries, work.path()).unwrap());
    let tag = format!("localhost/nmo-bundle:v{VERSION}");
    build_bundle_image(work.path(), &tag, Some(OPERATOR_IMAGE));
    isolated(move || async move {
        let begun = Instant::now();
        let mut cp = real_node::start_with(&[REAL], images).await;
        let registry = nmo_control_plane::OciRegistry::start(&binaries, work.path()).unwrap();
        cp.trust_registry(&registry.host()).unwrap();
        let reference = format!("{}/nmo-bundle:v{VERSION}", registry.host());
        push(work.path(), &tag, &reference);
        cp.start_olm().await.unwrap();
        let configs = catalog_of_image(&cp, work.path(), &reference);
        let address = cp.serve_catalog(&configs).await.unwrap();
        installs_and_maintains(&mut cp, &address, begun).await;

        // The bundle came through OLM's unpack Job, run on the real node:
        // its pod pulled the bundle image from the registry.
        let kubeconfig = cp.kubeconfig_path();
        let pulled = jsonpath(
            &kubeconfig,
            &["pods", "-n", OLM_NAMESPACE],
            "{range .items[*]}{.spec.nodeName} {.status.phase} {.status.initContainerStatuses[*].image}{\"\\n\"}{end}",
        )
        .await
        .unwrap_or_default();
        assert!(
            pulled
                .lines()
                .any(|l| l.starts_with(&format!("{REAL} Succeeded")) && l.contains(&reference)),
            "an unpack pod on {REAL} ran the bundle image {reference}: {pulled}"
        );
        eprintln!("OLM: the unpack pods (node, phase, init images):\n{pulled}");
        registry.stop();
        cp.stop();
    })
    .unwrap();
}

/// The `olm.bundle` of `opm render`'s JSON output: its name, package and
/// properties (the manifests among them); its image and related images
/// (which name the bundle image itself, if any) left out.
fn rendered_bundle(json: &str) -> Value {
    let bundle = serde_json::Deserializer::from_str(json)
        .into_iter::<Value>()
        .map(Result::unwrap)
        .find(|b| b["schema"] == "olm.bundle")
        .unwrap_or_else(|| panic!("no olm.bundle in {json}"));
    json!({
        "name": bundle["name"],
        "package": bundle["package"],
        "properties": bundle["properties"],
    })
}

/// The bundle image as shipped (`deploy/olm/bundle.Dockerfile`, built
/// here with buildah) and pushed to a registry (CNCF Distribution on
/// loopback) is a bundle opm reads back from the registry as the same
/// bundle, object for object, as the folder `deploy/olm/catalog.sh`
/// renders.
#[test]
fn the_bundle_image_built_from_its_dockerfile_renders_as_the_bundle_folder() {
    let binaries = nmo_control_plane::Binaries::ensure().expect("the control plane's binaries");
    let tmp = tempfile::tempdir().unwrap();
    let tag = format!("localhost/nmo-bundle:v{VERSION}");
    build_bundle_image(tmp.path(), &tag, None);
    let registry = nmo_control_plane::OciRegistry::start(&binaries, tmp.path()).unwrap();
    let reference = format!("{}/nmo-bundle:v{VERSION}", registry.host());
    push(tmp.path(), &tag, &reference);

    let opm = binaries.path("opm");
    let from_image = run(
        &opm,
        &["render", &reference, "--use-http", "-o", "json"],
        None,
    );
    let from_folder = run(
        &opm,
        &["render", &bundle_dir().display().to_string(), "-o", "json"],
        None,
    );
    let image_bundle = rendered_bundle(&from_image);
    assert_eq!(image_bundle["name"], format!("{PACKAGE}.v{VERSION}"));
    // Compared whole, shown short: the manifests are base64 JSON.
    assert!(
        image_bundle == rendered_bundle(&from_folder),
        "the bundle image renders otherwise than the folder:\n{from_image}"
    );
    registry.stop();
}
