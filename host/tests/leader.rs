//! Leader election: of two replicas only one leads; when it goes, the other
//! takes over once the lease expires.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nmo::controller::leader::{Elector, Timings};
use nmo_sim::{SimCluster, SimOptions};

fn timings() -> Timings {
    Timings {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_replica_leads_and_the_other_takes_over() {
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    let leading = Arc::new(AtomicUsize::new(0));
    let max_leading = Arc::new(AtomicUsize::new(0));
    let spawn = |id: &str| {
        let elector = Elector::new(client.clone(), "default", id, timings());
        let leading = leading.clone();
        let max_leading = max_leading.clone();
        tokio::spawn(async move {
            elector
                .run(async {
                    let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                    max_leading.fetch_max(now, Ordering::SeqCst);
                    // "Work" until aborted; count down when dropped.
                    struct Done(Arc<AtomicUsize>);
                    impl Drop for Done {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    let _done = Done(leading.clone());
                    std::future::pending::<()>().await;
                    Ok(())
                })
                .await
        })
    };
    let holder = |c: &SimCluster| {
        c.get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("default"),
            "135b1886.medik8s.io",
        )
        .map(|l| {
            l["spec"]["holderIdentity"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default()
    };
    let a = spawn("replica-a");
    // A leads first (its term has begun) before B stands.
    let started = std::time::Instant::now();
    while leading.load(Ordering::SeqCst) == 0 || holder(&c) != "replica-a" {
        assert!(started.elapsed() < Duration::from_secs(10), "A never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = spawn("replica-b");
    // B stands for the lock for a while (several of its retry periods):
    // never two leaders (`max_leading`, checked at the end).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(leading.load(Ordering::SeqCst), 1, "exactly one leader");
    let lease = c
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("default"),
            "135b1886.medik8s.io",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");
    // The leader dies without releasing: the other takes over after expiry.
    a.abort();
    let _ = a.await;
    let started = std::time::Instant::now();
    loop {
        let lease = c
            .get(
                "coordination.k8s.io/v1",
                "Lease",
                Some("default"),
                "135b1886.medik8s.io",
            )
            .unwrap();
        if lease["spec"]["holderIdentity"] == "replica-b" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "replica-b never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A's term has ended (aborted), B's has begun.
    let started = std::time::Instant::now();
    while leading.load(Ordering::SeqCst) != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "B's term never began"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        max_leading.load(Ordering::SeqCst),
        1,
        "never two leaders at once"
    );
    b.abort();
    c.stop().await;
}

/// A TCP proxy between one replica and the API server that can stall:
/// while stalled it forwards nothing, and its connections stay open (a
/// half-open connection, as a stopped proxy or a partition leaves them).
struct StallingProxy {
    addr: std::net::SocketAddr,
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

impl StallingProxy {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stalled.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                for (mut from, mut to, flag) in [
                    (
                        Box::new(ri) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                        Box::new(wo) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                        flag.clone(),
                    ),
                    (Box::new(ro) as _, Box::new(wi) as _, flag.clone()),
                ] {
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 << 10];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            while flag.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        StallingProxy { addr, stalled }
    }
}

/// A client straight to the simulated API server, and one through a
/// [`StallingProxy`] (returned too).
async fn direct_and_stallable(c: &SimCluster) -> (kube::Client, kube::Client, StallingProxy) {
    let proxy = StallingProxy::start(c.addr()).await;
    let direct = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    let via_proxy = nmo::client::client_from_kubeconfig(
        &c.kubeconfig()
            .replace(&c.url(), &format!("http://{}", proxy.addr)),
    )
    .await
    .unwrap();
    (direct, via_proxy, proxy)
}

/// Who acted when: (replica, from, until).
type Terms =
    Arc<std::sync::Mutex<Vec<(&'static str, std::time::Instant, Option<std::time::Instant>)>>>;

/// A leader's work: notes in `log` when it starts, acts until dropped,
/// and notes when it was dropped.
async fn term(id: &'static str, log: Terms) -> nmo::Result<()> {
    use std::time::Instant;
    let at = {
        let mut log = log.lock().unwrap();
        log.push((id, Instant::now(), None));
        log.len() - 1
    };
    struct Done(Terms, usize);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.lock().unwrap()[self.1].2 = Some(Instant::now());
        }
    }
    let _done = Done(log.clone(), at);
    std::future::pending::<()>().await;
    Ok(())
}

/// Replica A's connection to the API server stalls; replica B takes over.
/// A stops acting when its renew deadline passes, before B can acquire the
/// lease: at no moment do two replicas act.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_leader_steps_down_before_another_takes_over() {
    use std::time::Instant;
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    let (direct, via_proxy, proxy) = direct_and_stallable(&c).await;
    let log: Terms = Arc::default();
    let spawn = |id: &'static str, client: kube::Client| {
        let elector = Elector::new(client, "default", id, timings());
        let log = log.clone();
        tokio::spawn(async move { elector.run(term(id, log)).await })
    };
    let a = spawn("replica-a", via_proxy);
    let started = Instant::now();
    while log.lock().unwrap().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "A never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = spawn("replica-b", direct);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.stalled.store(true, Ordering::SeqCst);
    let stalled_at = Instant::now();
    let a_result = tokio::time::timeout(Duration::from_secs(10), a)
        .await
        .expect("A steps down within its renew deadline, though its connection hangs")
        .unwrap();
    assert!(
        matches!(a_result, Err(nmo::Error::LeadershipLost(_))),
        "{a_result:?}"
    );
    let started = Instant::now();
    while log.lock().unwrap().len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "B never took over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.stalled.store(false, Ordering::SeqCst);
    let log = log.lock().unwrap().clone();
    let (a_id, _, a_until) = log[0];
    let (b_id, b_from, _) = log[1];
    assert_eq!((a_id, b_id), ("replica-a", "replica-b"));
    let a_until = a_until.expect("A stopped");
    assert!(
        a_until < b_from,
        "two leaders at once: A until {:?}, B from {:?} after the stall",
        a_until - stalled_at,
        b_from - stalled_at
    );
    println!(
        "stalled leader: A stopped {:?} after the stall, B began {:?} after it ({:?} with no leader, no overlap)",
        a_until - stalled_at,
        b_from - stalled_at,
        b_from - a_until
    );
    b.abort();
    c.stop().await;
}

/// A leader that shuts down releases the lock: the standby takes over at
/// once, not after the lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_shutting_down_releases_the_lock() {
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    let slow = Timings {
        lease_duration: Duration::from_secs(30),
        renew_deadline: Duration::from_secs(20),
        retry_period: Duration::from_millis(200),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let a = {
        let elector = Elector::new(client.clone(), "default", "replica-a", slow.clone());
        tokio::spawn(async move {
            elector
                .run(async {
                    // The work ends as it does on SIGTERM.
                    let _ = stop_rx.await;
                    Ok(())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b_led = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b = {
        let elector = Elector::new(client.clone(), "default", "replica-b", slow);
        let b_led = b_led.clone();
        tokio::spawn(async move {
            elector
                .run(async {
                    b_led.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    Ok(())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b_led.load(Ordering::SeqCst));
    let stopped = std::time::Instant::now();
    stop_tx.send(()).unwrap();
    a.await.unwrap().unwrap();
    while !b_led.load(Ordering::SeqCst) {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "the standby waited for the 30 s lease to expire"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.abort();
    c.stop().await;
}

/// A leader cut off from the API server (its connection stalls past the
/// renew deadline) stops acting, stands for the lock again in the same
/// process, and leads again when it may: the outage is ridden out, with
/// no exit. Before, `lead` did not exist and the operator returned the
/// lost leadership as an error and exited (the pod restarted, its webhook
/// and probes down meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_stands_again_and_leads_when_it_may() {
    use std::time::Instant;
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    let (direct, via_proxy, proxy) = direct_and_stallable(&c).await;
    let log: Terms = Arc::default();
    let terms = |log: &Terms, id: &str| log.lock().unwrap().iter().filter(|t| t.0 == id).count();
    let wait_for = |what: &'static str, check: Box<dyn Fn() -> bool + Send>| async move {
        let started = Instant::now();
        while !check() {
            assert!(started.elapsed() < Duration::from_secs(15), "never {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let a = {
        let elector = Elector::new(via_proxy, "default", "replica-a", timings());
        let log = log.clone();
        tokio::spawn(async move {
            elector
                .lead(|| term("replica-a", log.clone()), std::future::pending())
                .await
        })
    };
    let l = log.clone();
    wait_for("A leading", Box::new(move || terms(&l, "replica-a") == 1)).await;
    // B leads until told to stop (then it releases the lock).
    let (stop_b, stopped_b) = tokio::sync::oneshot::channel::<()>();
    let b = {
        let elector = Elector::new(direct, "default", "replica-b", timings());
        let log = log.clone();
        tokio::spawn(async move {
            elector
                .run(async move {
                    tokio::select! {
                        r = term("replica-b", log) => r,
                        _ = stopped_b => Ok(()),
                    }
                })
                .await
        })
    };
    proxy.stalled.store(true, Ordering::SeqCst);
    let l = log.clone();
    wait_for(
        "B taking over",
        Box::new(move || terms(&l, "replica-b") == 1),
    )
    .await;
    proxy.stalled.store(false, Ordering::SeqCst);
    // A is a standby now, in the same call: it did not return.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!a.is_finished(), "A's lead returned: {:?}", a.await);
    assert_eq!(terms(&log, "replica-a"), 1, "A leads while B does");
    stop_b.send(()).unwrap();
    b.await.unwrap().unwrap();
    let l = log.clone();
    wait_for(
        "A leading again",
        Box::new(move || terms(&l, "replica-a") == 2),
    )
    .await;
    let log = log.lock().unwrap().clone();
    let (a1, b1, a2) = (&log[0], &log[1], &log[2]);
    assert_eq!((a1.0, b1.0, a2.0), ("replica-a", "replica-b", "replica-a"));
    let a1_until = a1.2.expect("A's first term ended");
    let b1_until = b1.2.expect("B's term ended");
    assert!(a1_until < b1.1, "A and B acted at once");
    assert!(b1_until <= a2.1, "B and A acted at once");
    println!(
        "cut off: A stopped, B led {:?}, A led again {:?} after B released",
        b1_until - b1.1,
        a2.1 - b1_until
    );
    a.abort();
    c.stop().await;
}

/// A lease held by another replica of the same Deployment whose pod is
/// gone (an uninstall that took the rights to release it before its pods
/// stopped, then a reinstall) is taken without waiting out its hour; while
/// that pod exists, it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_holders_pod_is_gone_is_taken_at_once() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, PostParams};
    let c = SimCluster::start(SimOptions::default()).await.unwrap();
    let client = nmo::client::client_from_kubeconfig(&c.kubeconfig())
        .await
        .unwrap();
    let old = "nmo-controller-manager-5d9c7b-abcde";
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": old},
            "spec": {"containers": [{"name": "manager", "image": "nmo"}]},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "default");
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "135b1886.medik8s.io"},
                "spec": {"holderIdentity": format!("{old}_1"), "leaseDurationSeconds": 3600,
                         "acquireTime": now, "renewTime": now},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let led = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let candidate = {
        let elector = Elector::new(
            client.clone(),
            "default",
            "nmo-controller-manager-7f8e9c-fghij_1",
            timings(),
        )
        .in_pod("nmo-controller-manager-7f8e9c-fghij");
        let led = led.clone();
        tokio::spawn(async move {
            elector
                .run(async {
                    led.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    Ok(())
                })
                .await
        })
    };
    // While the holder's pod exists, its lease stands: watched for five
    // of the candidate's quiet-holder checks (two retry periods each).
    let watched = std::time::Instant::now();
    while watched.elapsed() < timings().retry_period * 10 {
        assert!(
            !led.load(Ordering::SeqCst),
            "took the lease of a holder whose pod exists"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pods.delete(old, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let deleted = std::time::Instant::now();
    while !led.load(Ordering::SeqCst) {
        assert!(
            deleted.elapsed() < Duration::from_secs(30),
            "waited for the hour-long lease of a holder whose pod is gone"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    candidate.abort();
    c.stop().await;
}
