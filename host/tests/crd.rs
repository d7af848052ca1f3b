//! The CRD in deploy/ is generated from the Rust types and must not drift.

#[test]
fn deploy_crd_matches_the_rust_types() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"
    );
    let on_disk = std::fs::read_to_string(path).expect("deploy/crd exists");
    assert!(
        on_disk == nmo::crd::crd_yaml(),
        "deploy/crd is out of date: run `cargo run -p nmo -- crd > deploy/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml`"
    );
}

#[test]
fn the_crd_keeps_the_go_operators_api() {
    let crd: serde_json::Value = nmo::yaml::from_str(&nmo::crd::crd_yaml()).unwrap();
    assert_eq!(crd["spec"]["group"], "nodemaintenance.medik8s.io");
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["kind"], "NodeMaintenance");
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "nm");
    let v = &crd["spec"]["versions"][0];
    assert_eq!(v["name"], "v1beta1");
    assert!(v["subresources"]["status"].is_object());
    let schema = &v["schema"]["openAPIV3Schema"]["properties"];
    assert_eq!(schema["spec"]["required"][0], "nodeName");
    let status: Vec<&str> = schema["status"]["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for field in [
        "phase",
        "drainProgress",
        "lastUpdate",
        "lastError",
        "pendingPods",
        "pendingPodsRefs",
        "totalpods",
        "evictionPods",
        "errorOnLeaseCount",
    ] {
        assert!(
            status.contains(&field),
            "status.{field} missing: {status:?}"
        );
    }
}
