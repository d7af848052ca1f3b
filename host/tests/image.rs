//! The operator's image, built here from the repository's own Dockerfile
//! (`deploy/image/build.sh`: buildah, no outside registry) and read back as
//! the OCI archive a node imports: its user, entrypoint and files, held
//! against what `deploy/` runs it with, then run as its user on its own base.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::common;
use crate::common::real::rendered;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds the image once per test process (the script is quick when
/// nothing changed) and returns its OCI archive.
pub(crate) fn archive() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = nmo::sync::Locked::locked(&BUILT);
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    let out = Command::new("bash")
        .arg(repo().join("deploy/image/build.sh"))
        .current_dir(repo())
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "deploy/image/build.sh failed:\n{}",
        common::printed(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("image localhost/nmo:dev:"))
        .unwrap_or_else(|| panic!("no image line in:\n{stdout}"));
    eprintln!("{line}");
    let path = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("oci/nmo.tar");
    *built = Some(path.clone());
    path
}

/// One member of a tar archive, by the `tar` the machine has.
fn member(archive: &Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .expect("tar");
    assert!(out.status.success(), "{name}: {}", common::printed(&out));
    out.stdout
}

fn blob(archive: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    member(archive, &format!("blobs/sha256/{hex}"))
}

/// The image's config and its filesystem, every layer unpacked in order.
struct Image {
    config: serde_json::Value,
    root: tempfile::TempDir,
}

fn unpacked() -> Image {
    let archive = archive();
    let index: serde_json::Value = serde_json::from_slice(&member(&archive, "index.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&blob(
        &archive,
        index["manifests"][0]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&blob(
        &archive,
        manifest["config"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let file = root.path().join("layer");
        std::fs::write(&file, blob(&archive, layer["digest"].as_str().unwrap())).unwrap();
        let fs = root.path().join("fs");
        std::fs::create_dir_all(&fs).unwrap();
        // GNU tar recognises a compressed layer by itself.
        let out = Command::new("tar")
            .arg("-xf")
            .arg(&file)
            .arg("-C")
            .arg(&fs)
            .arg("--no-same-owner")
            .output()
            .unwrap();
        assert!(out.status.success(), "a layer: {}", common::printed(&out));
        std::fs::remove_file(&file).unwrap();
    }
    Image { config, root }
}

impl Image {
    fn path(&self, inside: &str) -> PathBuf {
        self.root
            .path()
            .join("fs")
            .join(inside.trim_start_matches('/'))
    }
}

/// Every policy the repository ships: the default and each example, by
/// the name the image gives it (the crate folder's).
fn shipped_policies() -> BTreeMap<String, Vec<u8>> {
    let mut dirs = vec![repo().join("policies/default")];
    for entry in std::fs::read_dir(repo().join("policies/examples")).unwrap() {
        dirs.push(entry.unwrap().path());
    }
    dirs.into_iter()
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = common::built_policy(&name.replace('-', "_"));
            (name, bytes)
        })
        .collect()
}

fn manager_container() -> serde_json::Value {
    rendered("default")
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment")["spec"]["template"]["spec"]["containers"][0]
        .clone()
}

#[test]
fn the_image_carries_what_the_deployment_runs() {
    let image = unpacked();
    let config = &image.config["config"];

    // The Deployment says runAsNonRoot and sets no runAsUser: the kubelet
    // starts the container only if the image's user is a non-zero number.
    let user = config["User"].as_str().expect("a user");
    let (uid, gid) = user.split_once(':').expect("uid:gid");
    assert_eq!((uid, gid), ("65532", "65532"), "{user}");
    let manager = manager_container();
    let pod_security = &rendered("default")
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap()["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(pod_security["runAsNonRoot"], true);
    assert!(
        pod_security["runAsUser"].is_null() && manager["securityContext"]["runAsUser"].is_null()
    );

    // No command in the Deployment: the image's entrypoint runs, with the
    // Deployment's args.
    assert!(manager["command"].is_null(), "{manager}");
    assert_eq!(config["Entrypoint"], serde_json::json!(["/nmo"]));
    assert!(config["Cmd"].is_null(), "{config}");
    let binary = std::fs::metadata(image.path("/nmo")).expect("/nmo in the image");
    use std::os::unix::fs::PermissionsExt;
    assert!(
        binary.permissions().mode() & 0o001 != 0,
        "/nmo is executable by any user"
    );
    // The Go operator's Deployments run `/manager`: with this image
    // swapped in, that is nmo.
    assert_eq!(
        std::fs::read_link(image.path("/manager")).expect("/manager in the image"),
        Path::new("nmo")
    );

    // Every shipped policy, as this repository builds it.
    let shipped = shipped_policies();
    assert!(shipped.len() >= 11, "{:?}", shipped.keys());
    for (name, bytes) in &shipped {
        let in_image = std::fs::read(image.path(&format!("/usr/share/nmo/policies/{name}.wasm")))
            .unwrap_or_else(|e| panic!("{name}.wasm in the image: {e}"));
        assert!(in_image == *bytes, "{name}.wasm differs from the build");
    }
    let listed: Vec<_> = std::fs::read_dir(image.path("/usr/share/nmo/policies"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        listed.len(),
        shipped.len(),
        "no test policy ships: {listed:?}"
    );
    // The ConfigMap the Deployment mounts carries the same bytes.
    for entry in std::fs::read_dir(repo().join("deploy/policies")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "wasm") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                std::fs::read(&path).unwrap()
                    == std::fs::read(image.path(&format!("/usr/share/nmo/policies/{name}")))
                        .unwrap(),
                "deploy/policies/{name} differs from the image's"
            );
        }
    }

    // The read-only root: what the operator writes goes to the volumes the
    // Deployment mounts, and the base has the loader and libraries the
    // binary was linked against.
    assert_eq!(manager["securityContext"]["readOnlyRootFilesystem"], true);
    let mounts: Vec<&str> = manager["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for arg in manager["args"].as_array().unwrap() {
        let arg = arg.as_str().unwrap();
        for flag in [
            "--policy-dir=",
            "--policy-cache-dir=",
            "--webhook-cert-dir=",
        ] {
            if let Some(dir) = arg.strip_prefix(flag) {
                assert!(
                    mounts.iter().any(|m| dir.starts_with(m)),
                    "{arg}: not on a mounted volume ({mounts:?})"
                );
            }
        }
    }
    for library in [
        "/lib64/ld-linux-x86-64.so.2",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "/etc/ssl/certs/ca-certificates.crt",
    ] {
        assert!(
            image.path(library).exists() || image.path(&format!("/usr{library}")).exists(),
            "{library} in the runtime base"
        );
    }
    let passwd = std::fs::read_to_string(image.path("/etc/passwd")).unwrap();
    assert!(passwd.contains(":65532:65532:"), "{passwd}");
}

/// The image runs: its binary starts on its own base, as its own user, with
/// no network, and checks every shipped policy (each compiled in a child
/// process, as the operator compiles them).
#[test]
fn the_image_runs_as_its_user_and_checks_every_shipped_policy() {
    archive();
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("deploy/image/build.sh"))
        .args(["run", "/nmo", "policy", "check"])
        .current_dir(repo());
    for name in shipped_policies().keys() {
        cmd.arg(format!("/usr/share/nmo/policies/{name}.wasm"));
    }
    let out = cmd.output().unwrap();
    let printed = common::printed(&out);
    assert!(out.status.success(), "{printed}");
    for name in shipped_policies().keys() {
        assert!(
            printed.contains(&format!("{name}.wasm")),
            "{name} not checked: {printed}"
        );
    }
}

/// The README's way to point the install at your image, with kubectl's own
/// kustomize (no kustomize binary): the overlay it writes renders
/// deploy/default with only the image changed.
#[test]
fn the_readmes_overlay_sets_the_image_and_nothing_else() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("mkdir -p my-nmo"))
        .expect("the README's overlay line")
        .replace("<registry>", "registry.example.com");
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo().join("deploy"), dir.path().join("deploy")).unwrap();
    let out = Command::new("bash")
        .args(["-c", &line])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::printed(&out));
    let out = Command::new("kubectl")
        .args(["kustomize", "my-nmo"])
        .current_dir(dir.path())
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "{}", common::printed(&out));
    let mine = nmo::yaml::documents::<serde_json::Value>(std::str::from_utf8(&out.stdout).unwrap())
        .unwrap();
    let mut theirs = rendered("default");
    for d in theirs.iter_mut().filter(|d| d["kind"] == "Deployment") {
        d["spec"]["template"]["spec"]["containers"][0]["image"] =
            "registry.example.com/nmo:latest".into();
    }
    let mine: Vec<_> = mine.into_iter().filter(|v| !v.is_null()).collect();
    assert_eq!(mine.len(), theirs.len());
    assert!(mine == theirs, "the overlay changed more than the image");
}
