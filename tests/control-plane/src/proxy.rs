//! The cluster network the API server reaches through: there is no pod
//! network here, so the API server's egress to the cluster (webhooks named
//! by a Service reference, among others) goes through this HTTP CONNECT
//! proxy (`--egress-selector-config-file`), which sends a Service's
//! in-cluster name (`<svc>.<ns>.svc:<port>`) to the loopback address a
//! test routed it to. TLS stays end to end: the API server checks the
//! server's certificate against the Service's name, as in a cluster.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

/// Where each in-cluster `host:port` goes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Routes(Arc<Mutex<HashMap<String, SocketAddr>>>);

impl Routes {
    pub(crate) fn add(&self, target: &str, to: SocketAddr) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target.to_owned(), to);
    }

    fn get(&self, target: &str) -> Option<SocketAddr> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(target)
            .copied()
    }
}

/// Serves CONNECT on `listener` until the task is aborted.
pub(crate) async fn serve(listener: UnixListener, routes: Routes) {
    while let Ok((conn, _)) = listener.accept().await {
        let routes = routes.clone();
        tokio::spawn(async move {
            let _ = tunnel(conn, &routes).await;
        });
    }
}

/// Reads `CONNECT host:port HTTP/1.1` and its headers, connects to the
/// route, answers 200 and copies both ways; 502 for an unknown target.
async fn tunnel(mut conn: UnixStream, routes: &Routes) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || conn.read(&mut byte).await? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let target = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("CONNECT "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    let Some(to) = routes.get(&target) else {
        conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            .await?;
        return Ok(());
    };
    let mut upstream = TcpStream::connect(to).await?;
    conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    Ok(())
}
