//! TLS for the operator's HTTPS servers (the webhook, `--metrics-secure`):
//! a certificate read from a folder and read again when it changes (a
//! rotated cert-manager Secret), a fixed one, a self-signed one made at
//! start, and the server configuration they share.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{ServerConfig, crypto::ring};

use crate::error::{Error, Result};
use crate::sync::Locked;

/// A certificate resolver that reads `tls.crt`/`tls.key` again whenever
/// they change on disk (a rotated cert-manager secret).
#[derive(Debug)]
pub(crate) struct ReloadingCert {
    dir: PathBuf,
    current: Mutex<(SystemTime, Arc<CertifiedKey>)>,
}

/// The certificate's and key's file names in `dir`: `tls.crt` and
/// `tls.key` (cert-manager's and controller-runtime's), or `apiserver.crt`
/// and `apiserver.key`, as OLM mounts a webhook's certificate for the Go
/// operator's bundle (`/apiserver.local.config/certificates`).
pub fn cert_files(dir: &Path) -> [&'static str; 2] {
    if !dir.join("tls.crt").exists() && dir.join("apiserver.crt").exists() {
        ["apiserver.crt", "apiserver.key"]
    } else {
        ["tls.crt", "tls.key"]
    }
}

/// Where OLM puts a webhook's certificate for an operator it installs.
pub const OLM_CERT_DIR: &str = "/apiserver.local.config/certificates";

fn modified(dir: &Path) -> SystemTime {
    cert_files(dir)
        .iter()
        .filter_map(|f| {
            std::fs::metadata(dir.join(f))
                .and_then(|m| m.modified())
                .ok()
        })
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

fn load_key(dir: &Path) -> Result<Arc<CertifiedKey>> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        Error::Config(format!("TLS {what} in {}: {e}", dir.display()))
    };
    let [cert_file, key_file] = cert_files(dir);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join(cert_file))
        .map_err(|e| bad("certificate", &e))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| bad("certificate", &e))?;
    if certs.is_empty() {
        return Err(bad(
            "certificate",
            &format!("no certificate in {cert_file}"),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(dir.join(key_file)).map_err(|e| bad("key", &e))?;
    let signing = ring::sign::any_supported_type(&key).map_err(|e| bad("key", &e))?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

impl ReloadingCert {
    /// Loads the certificate from `dir`; an error when it is missing or bad.
    pub fn new(dir: &Path) -> Result<Self> {
        let key = load_key(dir)?;
        Ok(ReloadingCert {
            dir: dir.to_owned(),
            current: Mutex::new((modified(dir), key)),
        })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.locked();
        let now = modified(&self.dir);
        if now != current.0 {
            match load_key(&self.dir) {
                Ok(key) => {
                    tracing::info!(dir = %self.dir.display(), "serving certificate reloaded");
                    *current = (now, key);
                }
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "keeping the previous certificate")
                }
            }
        }
        Some(current.1.clone())
    }
}

/// A TLS server configuration (HTTP/1.1 only: HTTP/2 stays off, as
/// controller-runtime's servers default to) with certificates from
/// `resolver`.
pub(crate) fn tls_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A certificate that never changes (a self-signed one made at start).
#[derive(Debug)]
pub(crate) struct FixedCert(pub Arc<CertifiedKey>);

impl ResolvesServerCert for FixedCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// A self-signed certificate for `names`, made now.
pub(crate) fn self_signed(names: Vec<String>) -> Result<Arc<CertifiedKey>> {
    let cert = rcgen::generate_simple_self_signed(names)
        .map_err(|e| Error::Config(format!("making a self-signed certificate: {e}")))?;
    let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .map_err(|e| Error::Config(format!("self-signed key: {e}")))?;
    let signing = ring::sign::any_supported_type(&key)
        .map_err(|e| Error::Config(format!("self-signed key: {e}")))?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.cert.der().clone()],
        signing,
    )))
}
