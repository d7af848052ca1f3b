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
    let a = spawn("replica-a");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = spawn("replica-b");
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(leading.load(Ordering::SeqCst), 1);
    assert_eq!(
        max_leading.load(Ordering::SeqCst),
        1,
        "never two leaders at once"
    );
    b.abort();
    c.stop().await;
}
