//! The real kubectl against the simulated cluster: it must work unchanged.

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use nmo_sim::{SimCluster, SimOptions};

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
    _dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(cluster: &SimCluster) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        cluster.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        Kubectl {
            kubeconfig,
            cache: dir.path().join("cache"),
            _dir: dir,
        }
    }

    async fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("kubectl is installed");
        let mut input = child.stdin.take().expect("stdin");
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).await.expect("write stdin");
        }
        drop(input);
        tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("kubectl finished in time")
            .expect("kubectl ran")
    }

    /// Runs kubectl and expects success; returns stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn apply(&self, yaml: &str) -> String {
        let out = self.run(&["apply", "-f", "-"], Some(yaml)).await;
        assert!(
            out.status.success(),
            "apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl and expects failure; returns stderr.
    async fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin).await;
        assert!(
            !out.status.success(),
            "kubectl {args:?} should fail: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

async fn cluster(nodes: usize) -> SimCluster {
    let c = SimCluster::start(SimOptions {
        time_scale: 10.0,
        ..SimOptions::default()
    })
    .await
    .expect("start");
    for i in 1..=nodes {
        c.add_node(&format!("worker-{i}")).expect("node");
    }
    c
}

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.27
"#;

fn header(out: &str) -> Vec<String> {
    out.lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

async fn wait_for(k: &Kubectl, args: &[&str], expected: &str) -> String {
    let started = Instant::now();
    loop {
        let out = k.ok(args).await;
        if out.contains(expected) {
            return out;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "timed out waiting for {expected:?} in:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_prints_the_columns_of_a_real_cluster() {
    let c = cluster(2).await;
    let k = Kubectl::new(&c);
    assert_eq!(
        header(&k.ok(&["get", "nodes"]).await),
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    );
    assert!(k.apply(WEB).await.contains("deployment.apps/web created"));
    let deploy = wait_for(&k, &["get", "deploy", "web"], "3/3").await;
    assert_eq!(
        header(&deploy),
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    );
    let pods = k.ok(&["get", "pods", "-o", "wide"]).await;
    assert_eq!(
        header(&pods),
        [
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE",
            "NOMINATED NODE",
            "READINESS GATES"
        ]
    );
    assert_eq!(
        pods.lines().filter(|l| l.contains("Running")).count(),
        3,
        "{pods}"
    );
    assert!(
        pods.contains("worker-1") && pods.contains("worker-2"),
        "spread over nodes: {pods}"
    );
    let rs = k.ok(&["get", "rs"]).await;
    assert_eq!(header(&rs), ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);
    // Short names and -o jsonpath work from discovery.
    assert_eq!(
        k.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}"
        ])
        .await,
        "3"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_taint_cordon_patch_and_scale() {
    let c = cluster(2).await;
    let k = Kubectl::new(&c);
    k.ok(&["label", "node", "worker-1", "disk=ssd"]).await;
    k.ok(&["taint", "node", "worker-1", "dedicated=db:NoSchedule"])
        .await;
    k.ok(&["cordon", "worker-1"]).await;
    let node = k
        .ok(&[
            "get",
            "node",
            "worker-1",
            "-o",
            "jsonpath={.metadata.labels.disk} {.spec.unschedulable} {.spec.taints[0].key}",
        ])
        .await;
    assert_eq!(node, "ssd true dedicated");
    assert!(
        k.ok(&["get", "nodes"])
            .await
            .contains("Ready,SchedulingDisabled")
    );
    k.ok(&["uncordon", "worker-1"]).await;
    k.ok(&["taint", "node", "worker-1", "dedicated-"]).await;
    k.ok(&["label", "node", "worker-1", "disk-"]).await;
    let node = k
        .ok(&[
            "get",
            "node",
            "worker-1",
            "-o",
            "jsonpath=[{.metadata.labels.disk}] [{.spec.unschedulable}] [{.spec.taints}]",
        ])
        .await;
    // uncordon removes the field, as on a real cluster (omitempty).
    assert_eq!(node, "[] [] []");

    k.apply(WEB).await;
    k.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":2}}"#,
    ])
    .await;
    wait_for(&k, &["get", "deploy", "web"], "2/2").await;
    k.ok(&["scale", "deploy", "web", "--replicas=4"]).await;
    wait_for(&k, &["get", "deploy", "web"], "4/4").await;
    // A JSON patch whose test fails changes nothing.
    let err = k
        .fails(
            &["patch", "deploy", "web", "--type=json", "-p", r#"[{"op":"test","path":"/spec/replicas","value":9},{"op":"replace","path":"/spec/replicas","value":1}]"#],
            None,
        )
        .await;
    assert!(err.contains("invalid"), "{err}");
    assert_eq!(
        k.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"])
            .await,
        "4"
    );
    // Re-applying the manifest patches it back (client-side apply).
    assert!(k.apply(WEB).await.contains("configured"));
    wait_for(&k, &["get", "deploy", "web"], "3/3").await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_wait_and_describe() {
    let c = cluster(1).await;
    let k = Kubectl::new(&c);
    k.apply(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: solo\n  annotations:\n    sim.nmo.medik8s.io/shutdown-seconds: \"20\"\nspec:\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: c\n    image: busybox\n",
    )
    .await;
    wait_for(&k, &["get", "pod", "solo"], "Running").await;
    k.ok(&["wait", "--for=condition=Ready", "pod/solo", "--timeout=20s"])
        .await;
    let describe = k.ok(&["describe", "pod", "solo"]).await;
    assert!(
        describe.contains("Name:") && describe.contains("solo") && describe.contains("worker-1"),
        "{describe}"
    );
    // Graceful deletion: Terminating for 20 simulated seconds (2 s real).
    k.ok(&["delete", "pod", "solo", "--wait=false"]).await;
    assert!(k.ok(&["get", "pod", "solo"]).await.contains("Terminating"));
    let started = Instant::now();
    k.ok(&["wait", "--for=delete", "pod/solo", "--timeout=30s"])
        .await;
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "the grace period was honoured"
    );
    let err = k.fails(&["get", "pod", "solo"], None).await;
    assert!(err.contains("pods \"solo\" not found"), "{err}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_the_disruption_budget() {
    let c = cluster(3).await;
    let k = Kubectl::new(&c);
    k.apply(&WEB.replace("replicas: 3", "replicas: 2")).await;
    k.apply("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\nspec:\n  minAvailable: 2\n  selector:\n    matchLabels: {app: web}\n").await;
    k.apply("apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: agent\nspec:\n  selector:\n    matchLabels: {app: agent}\n  template:\n    metadata:\n      labels: {app: agent}\n    spec:\n      containers:\n      - name: a\n        image: agent\n").await;
    wait_for(&k, &["get", "deploy", "web"], "2/2").await;
    wait_for(&k, &["get", "pdb", "web"], "   0   ").await;
    let node = k
        .ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[0].spec.nodeName}",
        ])
        .await;

    // The PDB allows no disruption: the drain retries its eviction...
    c.record_audit(true);
    let drain = {
        let kubeconfig = k.kubeconfig.clone();
        let cache = k.cache.clone();
        let node = node.clone();
        tokio::spawn(async move {
            tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg("--cache-dir")
                .arg(cache)
                .args([
                    "drain",
                    &node,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--force",
                    "--timeout=60s",
                ])
                .output()
                .await
                .expect("kubectl drain")
        })
    };
    // Its eviction is refused (429) at least once: the budget holds it.
    let started = std::time::Instant::now();
    while !c
        .audit()
        .iter()
        .any(|r| r.subresource == "eviction" && r.code == 429)
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "kubectl drain never tried an eviction"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!drain.is_finished(), "drain must wait for the PDB");
    // ...until a third replica is Ready elsewhere.
    k.ok(&["scale", "deploy", "web", "--replicas=3"]).await;
    let out = drain.await.expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "drain failed: {stderr}\n{stdout}");
    let all = format!("{stdout}{stderr}");
    assert!(
        all.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{all}"
    );
    assert!(stdout.contains(&format!("node/{node} drained")), "{stdout}");
    let on_node = k
        .ok(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "name",
        ])
        .await;
    assert_eq!(
        on_node.lines().count(),
        1,
        "only the DaemonSet pod stays: {on_node}"
    );
    assert!(on_node.contains("agent"), "{on_node}");
    c.stop().await;
}

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: nodemaintenances.nodemaintenance.medik8s.io
spec:
  group: nodemaintenance.medik8s.io
  names:
    kind: NodeMaintenance
    listKind: NodeMaintenanceList
    plural: nodemaintenances
    shortNames: [nm]
    singular: nodemaintenance
  scope: Cluster
  versions:
  - name: v1beta1
    served: true
    storage: true
    subresources:
      status: {}
    additionalPrinterColumns:
    - name: Node
      type: string
      jsonPath: .spec.nodeName
    - name: Phase
      type: string
      jsonPath: .status.phase
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [nodeName]
            properties:
              nodeName: {type: string}
              reason: {type: string}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_then_its_objects() {
    let c = cluster(1).await;
    let k = Kubectl::new(&c);
    assert!(k.apply(CRD).await.contains("created"));
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/nodemaintenances.nodemaintenance.medik8s.io",
        "--timeout=10s",
    ])
    .await;
    k.apply("apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: nm-1\nspec:\n  nodeName: worker-1\n  reason: kernel\n").await;
    let out = k.ok(&["get", "nm"]).await;
    assert_eq!(header(&out), ["NAME", "NODE", "PHASE", "AGE"]);
    assert!(out.contains("nm-1") && out.contains("worker-1"), "{out}");
    let err = k
        .fails(&["apply", "-f", "-"], Some("apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: nm-2\nspec:\n  reason: no node\n"))
        .await;
    assert!(err.contains("spec.nodeName: Required value"), "{err}");
    // Status goes through the subresource only.
    k.ok(&[
        "patch",
        "nm",
        "nm-1",
        "--type=merge",
        "--subresource=status",
        "-p",
        r#"{"status":{"phase":"Running"}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "nm",
        "nm-1",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Failed"}}"#,
    ])
    .await;
    assert_eq!(
        k.ok(&["get", "nm", "nm-1", "-o", "jsonpath={.status.phase}"])
            .await,
        "Running"
    );
    // A custom resource has no Go type to merge strategically by: kubectl
    // patch's default type is refused, as on a real server; labels work.
    let err = k
        .fails(
            &["patch", "nm", "nm-1", "-p", r#"{"spec":{"reason":"x"}}"#],
            None,
        )
        .await;
    assert!(
        err.contains("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"),
        "{err}"
    );
    k.ok(&["label", "nm", "nm-1", "team=infra"]).await;
    k.ok(&["annotate", "nm", "nm-1", "note=hi"]).await;
    k.ok(&["delete", "nm", "nm-1"]).await;
    assert!(
        k.fails(&["get", "nm", "nm-1"], None)
            .await
            .contains("not found")
    );
    c.stop().await;
}

/// A ConfigMap too big for client-side apply's last-applied annotation is
/// refused as a real API server refuses it; server-side apply stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_configmaps_need_server_side_apply() {
    let c = cluster(1).await;
    let k = Kubectl::new(&c);
    // 300 KB of binaryData (base64 of 225 KB).
    let blob = "QUJD".repeat(75_000);
    let cm = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big, namespace: default}}\nbinaryData:\n  blob.bin: {blob}\n"
    );
    let err = k.fails(&["apply", "-f", "-"], Some(&cm)).await;
    assert!(
        err.contains(
            "The ConfigMap \"big\" is invalid: metadata.annotations: Too long: must have at most 262144 bytes"
        ),
        "{err}"
    );
    let out = k
        .run(&["apply", "--server-side", "-f", "-"], Some(&cm))
        .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        k.ok(&[
            "get",
            "configmap",
            "big",
            "-o",
            "jsonpath={.binaryData.blob\\.bin}"
        ])
        .await
        .len(),
        blob.len()
    );
    // Over 1 MiB is too big for any ConfigMap.
    let huge = cm.replace(&blob, &"QUJD".repeat(400_000));
    let err = k
        .fails(&["apply", "--server-side", "-f", "-"], Some(&huge))
        .await;
    assert!(
        err.contains("Too long: must have at most 1048576 bytes"),
        "{err}"
    );
}

/// kubectl's imperative commands send protobuf for built-in kinds (as every
/// client-go program does by default); they work as on a real cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imperative_commands_speak_protobuf() {
    let c = cluster(2).await;
    c.record_audit(true);
    let k = Kubectl::new(&c);
    k.ok(&["create", "namespace", "shop"]).await;
    k.ok(&[
        "run",
        "cart",
        "-n",
        "shop",
        "--image=busybox:1.36",
        "--labels=app=cart,tier=web",
        "--env=MODE=fast",
        "--restart=Never",
    ])
    .await;
    k.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "shop",
        "--image=nginx:1.27",
        "--replicas=2",
        "--port=8080",
    ])
    .await;
    // A policy module is binary: every byte value, NULs included.
    let dir = tempfile::tempdir().expect("tempdir");
    let wasm: Vec<u8> = b"\0asm\x01\0\0\0"
        .iter()
        .copied()
        .chain((0..=255u8).cycle().take(70_000))
        .collect();
    let file = dir.path().join("my-policy.wasm");
    std::fs::write(&file, &wasm).expect("write");
    let from_file = format!("--from-file={}", file.display());
    k.ok(&["create", "configmap", "policies", "-n", "shop", &from_file])
        .await;
    k.ok(&[
        "create",
        "secret",
        "generic",
        "token",
        "-n",
        "shop",
        "--from-literal=key=s3cr3t",
    ])
    .await;
    k.ok(&["create", "serviceaccount", "robot", "-n", "shop"])
        .await;

    // (`kubectl run` alone sends JSON.)
    let mut protobuf_creates: Vec<String> = c
        .audit()
        .iter()
        .filter(|r| r.verb == "create" && r.content_type == "application/vnd.kubernetes.protobuf")
        .map(|r| r.resource.clone())
        .collect();
    protobuf_creates.sort();
    assert_eq!(
        protobuf_creates,
        [
            "configmaps",
            "deployments",
            "namespaces",
            "secrets",
            "serviceaccounts"
        ],
        "{:?}",
        c.audit()
    );

    created_as_asked(&k, &wasm).await;

    // Deletes, with protobuf DeleteOptions where kubectl sends them.
    k.ok(&[
        "delete",
        "pod",
        "cart",
        "-n",
        "shop",
        "--grace-period=0",
        "--force",
    ])
    .await;
    let gone = k.fails(&["get", "pod", "cart", "-n", "shop"], None).await;
    assert!(gone.contains("NotFound"), "{gone}");
    k.ok(&["delete", "deployment", "web", "-n", "shop"]).await;
    k.ok(&["delete", "namespace", "shop", "--wait=false"]).await;
    c.stop().await;
}

/// What `imperative_commands_speak_protobuf` created is what it asked
/// for: the binary ConfigMap byte for byte, the pod's labels, env and
/// defaults, the Secret, the Deployment's replicas and port.
async fn created_as_asked(k: &Kubectl, wasm: &[u8]) {
    use base64::Engine;
    let stored = k
        .ok(&[
            "get",
            "configmap",
            "policies",
            "-n",
            "shop",
            "-o",
            "jsonpath={.binaryData.my-policy\\.wasm}",
        ])
        .await;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(stored.trim())
            .expect("base64"),
        wasm
    );
    let pod = k
        .ok(&["get", "pod", "cart", "-n", "shop", "-o", "jsonpath={.metadata.labels.tier} {.spec.containers[0].env[0].value} {.spec.restartPolicy} {.spec.terminationGracePeriodSeconds}"])
        .await;
    assert_eq!(pod, "web fast Never 30");
    let secret = k
        .ok(&[
            "get",
            "secret",
            "token",
            "-n",
            "shop",
            "-o",
            "jsonpath={.data.key}",
        ])
        .await;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(secret.trim())
            .expect("base64"),
        b"s3cr3t"
    );
    wait_for(k, &["get", "deployment", "web", "-n", "shop"], "2/2").await;
    let port = k
        .ok(&[
            "get",
            "deployment",
            "web",
            "-n",
            "shop",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].ports[0].containerPort}",
        ])
        .await;
    assert_eq!(port, "8080");
}

/// kubectl as the service account `robot`, by its token.
struct Robot<'a> {
    k: &'a Kubectl,
    token: String,
}

impl Robot<'_> {
    async fn run(&self, args: &[&str]) -> Output {
        let with_token: Vec<&str> = std::iter::once(self.token.as_str())
            .chain(args.iter().copied())
            .collect();
        self.k.run(&with_token, None).await
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// With authorization on (HTTPS, bearer tokens, RBAC), kubectl sees what it
/// sees on a real cluster: 401 without a known token, 403 in the real
/// words, `auth can-i`, `create token`, `--as`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_is_enforced_when_switched_on() {
    let c = SimCluster::start(SimOptions {
        tls: true,
        ..SimOptions::default()
    })
    .await
    .expect("start");
    c.set_authorization(true);
    c.add_node("worker-1").expect("node");
    let k = Kubectl::new(&c);
    assert!(c.url().starts_with("https://"));
    k.ok(&["create", "serviceaccount", "robot"]).await;
    let token = k.ok(&["create", "token", "robot"]).await;
    let robot = Robot {
        k: &k,
        token: format!("--token={}", token.trim()),
    };
    refused_before_a_grant(&robot).await;
    grant_pods_and_one_node(&k).await;
    allowed_as_granted(&robot).await;
    // The administrator may impersonate.
    let out = k
        .run(
            &[
                "auth",
                "can-i",
                "list",
                "pods",
                "--as=system:serviceaccount:default:robot",
                "-n",
                "kube-system",
            ],
            None,
        )
        .await;
    assert_eq!(stdout(&out), "no");
    // No known token: 401.
    let out = k.run(&["--token=nobody", "get", "pods"], None).await;
    assert!(stderr(&out).contains("Unauthorized"), "{}", stderr(&out));
    c.stop().await;
}

/// A service account with no grant: 403 in the real server's words.
async fn refused_before_a_grant(robot: &Robot<'_>) {
    let out = robot.run(&["get", "pods"]).await;
    assert_eq!(
        stderr(&out).trim(),
        "Error from server (Forbidden): pods is forbidden: User \"system:serviceaccount:default:robot\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let out = robot.run(&["delete", "node", "worker-1"]).await;
    assert!(
        stderr(&out).contains("nodes \"worker-1\" is forbidden: User \"system:serviceaccount:default:robot\" cannot delete resource \"nodes\" in API group \"\" at the cluster scope"),
        "{}",
        stderr(&out)
    );
    // A protobuf request gets its 403 as a protobuf Status.
    let out = robot.run(&["create", "namespace", "mine"]).await;
    assert!(
        stderr(&out).contains("namespaces is forbidden"),
        "{}",
        stderr(&out)
    );
    let out = robot.run(&["auth", "can-i", "list", "pods"]).await;
    assert_eq!(stdout(&out), "no");
    assert!(!out.status.success());
}

/// Grants `robot`: get and list pods in default (and their subresources,
/// by pattern), and get of one named node.
async fn grant_pods_and_one_node(k: &Kubectl) {
    for args in [
        &[
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=pods,pods/*",
        ][..],
        &[
            "create",
            "rolebinding",
            "reader",
            "--role=reader",
            "--serviceaccount=default:robot",
        ],
        &[
            "create",
            "clusterrole",
            "one-node",
            "--verb=get",
            "--resource=nodes",
            "--resource-name=worker-1",
        ],
        &[
            "create",
            "clusterrolebinding",
            "one-node",
            "--clusterrole=one-node",
            "--serviceaccount=default:robot",
        ],
    ] {
        k.ok(args).await;
    }
}

/// What the grant allows, and nothing more.
async fn allowed_as_granted(robot: &Robot<'_>) {
    let out = robot.run(&["get", "pods"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let log = ["auth", "can-i", "get", "pods", "--subresource=log"];
    assert_eq!(stdout(&robot.run(&log).await), "yes");
    let elsewhere = ["auth", "can-i", "list", "pods", "-n", "kube-system"];
    assert_eq!(stdout(&robot.run(&elsewhere).await), "no");
    let out = robot.run(&["get", "node", "worker-1"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = robot.run(&["get", "nodes"]).await;
    assert!(!out.status.success(), "resourceNames do not allow a list");
    let whoami = [
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ];
    let out = robot.run(&whoami).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "system:serviceaccount:default:robot",
        "{}",
        stderr(&out)
    );
}

/// `kubectl logs`: what the simulated kubelet writes, lines a test adds,
/// container choice, --tail, --timestamps, -f until the pod is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_as_a_kubelet_keeps_them() {
    let c = cluster(1).await;
    let k = Kubectl::new(&c);
    k.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: two, namespace: default}\nspec:\n  containers: [{name: app, image: img-a}, {name: sidecar, image: img-b}]\n",
    )
    .await;
    k.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: slow, namespace: default, annotations: {sim.nmo.medik8s.io/startup-seconds: '3600'}}\nspec:\n  containers: [{name: app, image: img}]\n",
    )
    .await;
    wait_for(&k, &["get", "pod", "two"], "Running").await;
    // kubectl picks the first container itself; the server, asked without
    // one, answers as a real one.
    let out = k.run(&["logs", "two"], None).await;
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("Defaulted container \"app\" out of: app, sidecar"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = k
        .fails(
            &["get", "--raw", "/api/v1/namespaces/default/pods/two/log"],
            None,
        )
        .await;
    assert!(
        err.contains(
            "a container name must be specified for pod two, choose one of: [app sidecar]"
        ),
        "{err}"
    );
    let err = k.fails(&["logs", "two", "-c", "nope"], None).await;
    assert!(
        err.contains("container nope is not valid for pod two"),
        "{err}"
    );
    let err = k.fails(&["logs", "slow"], None).await;
    assert!(
        err.contains("container \"app\" in pod \"slow\" is waiting to start: ContainerCreating"),
        "{err}"
    );
    assert_eq!(
        k.ok(&["logs", "two", "-c", "sidecar"]).await,
        "[nmo-sim] sidecar: started, image img-b, on worker-1\n"
    );
    for i in 1..=5 {
        c.append_log("default", "two", Some("app"), &format!("request {i}"))
            .unwrap();
    }
    assert_eq!(
        k.ok(&["logs", "two", "-c", "app", "--tail=2"]).await,
        "request 4\nrequest 5\n"
    );
    let stamped = k
        .ok(&["logs", "two", "-c", "app", "--tail=1", "--timestamps"])
        .await;
    let (at, text) = stamped.trim_end().split_once(' ').unwrap();
    assert!(at.parse::<jiff::Timestamp>().is_ok(), "{stamped}");
    assert_eq!(text, "request 5");
    let err = c.append_log("default", "nope", None, "x").unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");

    // Follow: new lines stream; it ends when the pod is gone.
    let follow = {
        let kubeconfig = k.kubeconfig.clone();
        tokio::spawn(async move {
            tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["logs", "-f", "two", "-c", "app", "--tail=1"])
                .kill_on_drop(true)
                .output()
                .await
                .expect("kubectl")
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.append_log("default", "two", Some("app"), "late line")
        .unwrap();
    k.ok(&["delete", "pod", "two", "--wait=false"]).await;
    let out = tokio::time::timeout(Duration::from_secs(20), follow)
        .await
        .expect("-f ends when the pod is gone")
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "request 5\nlate line\n[nmo-sim] app: received SIGTERM, grace period 30s\n"
    );
    c.stop().await;
}

/// `kubectl explain` reads the OpenAPI v3 documents: built-in kinds carry
/// k8s-openapi's schemas, a CRD's kinds its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_finds_built_in_and_custom_schemas() {
    let c = cluster(1).await;
    let k = Kubectl::new(&c);
    let out = k.ok(&["explain", "pod.spec.containers.image"]).await;
    assert!(out.contains("FIELD: image <string>"), "{out}");
    assert!(out.contains("Container image name."), "{out}");
    let out = k.ok(&["explain", "deployment.spec.replicas"]).await;
    assert!(out.contains("GROUP:      apps"), "{out}");
    assert!(out.contains("FIELD: replicas <integer>"), "{out}");
    k.apply(include_str!(
        "../../../deploy/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"
    ))
    .await;
    let out = wait_for(&k, &["explain", "nodemaintenance.spec"], "nodeName").await;
    assert!(out.contains("KIND:       NodeMaintenance"), "{out}");
    assert!(out.contains("nodeName\t<string> -required-"), "{out}");
    let out = k.ok(&["explain", "nm.metadata.name"]).await;
    assert!(out.contains("FIELD: name <string>"), "{out}");
    c.stop().await;
}
