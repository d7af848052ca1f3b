//! Policies from OCI registries, pinned by digest.
//!
//! `policies.yaml` may name a policy by reference instead of shipping its
//! `.wasm` in the ConfigMap (which holds 1 MiB at most):
//!
//! ```yaml
//! pull:
//!   never-force: registry.example.com/team/never-force@sha256:<64 hex digits>
//! ```
//!
//! A reference must carry its manifest's digest (a tag may be given too,
//! for people; the digest decides). The artifact is a Wasm OCI artifact:
//! the CNCF layout (`application/wasm` layer, config
//! `application/vnd.wasm.config.v0+json`, what `nmo policy push`, `wkg oci
//! push` and `oci-wasm` write) or the older wasm-to-oci one
//! (`application/vnd.wasm.content.layer.v1+wasm`, what kwctl pushes), with
//! exactly one Wasm layer.
//!
//! What is pulled is verified before it is used: the manifest's SHA-256
//! must be the pinned digest, and the layer's SHA-256 the digest the
//! manifest gives it. Both are kept in memory for the life of the process
//! and, with a policy cache directory, on disk (`<cache>/oci/`), checked
//! again when read: a restart needs no registry, and a damaged file is
//! pulled again, never trusted.
//!
//! Registries are spoken to over HTTPS, except loopback ones (`localhost`,
//! `127.0.0.0/8`, `[::1]`, as Docker treats them) and those named as
//! insecure. Credentials come from a Docker config file
//! (`kubernetes.io/dockerconfigjson`'s format), when one is given.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::error::{Error, Result};
use nmo_policy_runtime::digest::hex_digest;

use crate::sync::Locked;

/// The layer media type of the CNCF Wasm OCI artifact (the one pushed).
pub(crate) const WASM_LAYER: &str = "application/wasm";
/// The config media type of the CNCF Wasm OCI artifact.
pub(crate) const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
/// The older wasm-to-oci layer media type (kwctl's), accepted when pulled.
pub(crate) const WASM_TO_OCI_LAYER: &str = "application/vnd.wasm.content.layer.v1+wasm";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// Largest manifest accepted.
const MAX_MANIFEST_BYTES: usize = 64 << 10;
/// Largest policy accepted from a registry (the engine's own size limit on
/// a policy is lower; this keeps a hostile registry from filling memory).
pub(crate) const MAX_POLICY_BYTES: u64 = 16 << 20;
/// How long one pull or push may take in all.
const DEADLINE: Duration = Duration::from_secs(60);

/// How registries are reached.
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// Registries (`host` or `host:port`) spoken to over plain HTTP besides
    /// the loopback ones.
    pub insecure: Vec<String>,
    /// A Docker config file (`{"auths": {"host": {"auth": base64}}}`) with
    /// the credentials for registries that need them.
    pub auth_file: Option<PathBuf>,
}

impl RegistryConfig {
    /// For a command a person runs: the credentials `docker login` (and
    /// crane, helm, oras) keep, `$DOCKER_CONFIG/config.json` or
    /// `~/.docker/config.json`.
    pub fn for_user(insecure: Vec<String>) -> Self {
        let dir = std::env::var_os("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")));
        RegistryConfig {
            insecure,
            auth_file: dir.map(|d| d.join("config.json")),
        }
    }
}

/// Pulls (and pushes) policies. Cheap to clone; clones share what was
/// pulled.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    config: RegistryConfig,
    /// Where verified pulls are kept between starts, if anywhere.
    disk: Option<PathBuf>,
    /// Verified pulls of this process, by pinned reference digest.
    memory: Arc<Mutex<BTreeMap<String, Arc<Vec<u8>>>>>,
}

/// A reference pinned by digest.
#[derive(Debug, Clone)]
pub struct Pinned {
    reference: Reference,
    /// `sha256:<hex>`.
    digest: String,
}

impl Pinned {
    /// Parses `registry/repository[:tag]@sha256:<64 hex>`; a reference
    /// without a digest is refused, saying how to pin it.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim().trim_start_matches("oci://");
        let reference = Reference::from_str(text).map_err(|e| pull_error(text, e.to_string()))?;
        let Some(digest) = reference.digest().map(str::to_owned) else {
            return Err(pull_error(
                text,
                "not pinned by digest: name the manifest's digest \
                 (REGISTRY/REPOSITORY@sha256:<64 hex digits>; `nmo policy push` prints it), so \
                 what runs is exactly what was reviewed"
                    .into(),
            ));
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(pull_error(
                text,
                format!("digest {digest} is not sha256:<64 hex digits>"),
            ));
        }
        Ok(Pinned {
            reference,
            digest: digest.to_ascii_lowercase(),
        })
    }

    /// The reference as given (normalised).
    pub fn whole(&self) -> String {
        self.reference.whole()
    }

    /// `sha256:<hex>` of the manifest.
    pub fn digest(&self) -> &str {
        &self.digest
    }
}

fn pull_error(reference: &str, why: String) -> Error {
    Error::Pull {
        reference: reference.to_owned(),
        why,
    }
}

fn push_error(reference: &str, why: impl std::fmt::Display) -> Error {
    Error::Pull {
        reference: reference.to_owned(),
        why: format!("push: {why}"),
    }
}

/// `sha256:<hex>` of bytes.
fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex_digest(bytes))
}

/// Whether a registry host is on this machine.
fn is_loopback(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.split(':').next().unwrap_or("")
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Registry {
    /// A registry client with this configuration, keeping pulls in memory
    /// only.
    pub fn new(config: RegistryConfig) -> Self {
        Registry {
            config,
            ..Default::default()
        }
    }

    /// Keeps verified pulls in `dir` as well (created private, `0700`).
    pub fn with_disk_cache(mut self, dir: &Path) -> Self {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
        {
            Ok(()) => self.disk = Some(dir.to_owned()),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "not keeping pulled policies on disk");
            }
        }
        self
    }

    /// The policy a pinned reference names: from memory, from the disk
    /// cache (checked again), or pulled and verified. Blocking: it runs
    /// the pull on a thread of its own, so it may be called from anywhere.
    pub fn fetch(&self, pinned: &Pinned) -> Result<Arc<Vec<u8>>> {
        if let Some(hit) = self.memory.locked().get(&pinned.digest) {
            return Ok(hit.clone());
        }
        let bytes = match self.cached(pinned) {
            Some(bytes) => bytes,
            None => {
                let started = std::time::Instant::now();
                let (manifest, bytes) = self.block_on(&pinned.whole(), self.pull(pinned))??;
                tracing::info!(reference = %pinned.whole(), bytes = bytes.len(), seconds = started.elapsed().as_secs_f64(), "policy pulled and verified");
                self.keep(pinned, &manifest, &bytes);
                bytes
            }
        };
        let bytes = Arc::new(bytes);
        self.memory
            .locked()
            .insert(pinned.digest.clone(), bytes.clone());
        Ok(bytes)
    }

    /// Runs a future to its end on a current-thread runtime of its own, on
    /// a thread of its own (so that a caller inside an async runtime does
    /// not block it or nest runtimes), under [`DEADLINE`].
    fn block_on<T: Send>(
        &self,
        reference: &str,
        work: impl Future<Output = T> + Send,
    ) -> Result<T> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| pull_error(reference, format!("client runtime: {e}")))?;
                    runtime
                        .block_on(async { tokio::time::timeout(DEADLINE, work).await })
                        .map_err(|_| {
                            pull_error(
                                reference,
                                format!("the registry did not finish within {DEADLINE:?}"),
                            )
                        })
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(pull_error(reference, "the registry client panicked".into()))
                })
        })
    }

    fn client(&self, registry: &str) -> Result<Client> {
        // reqwest's rustls is built without a provider of its own: the
        // operator's TLS is ring throughout. Installing it is a no-op when
        // a default is already there.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let plain = is_loopback(registry) || self.config.insecure.iter().any(|r| r == registry);
        let config = ClientConfig {
            protocol: if plain {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(30)),
            platform_resolver: None,
            user_agent: concat!("nmo/", env!("CARGO_PKG_VERSION")),
            ..Default::default()
        };
        Client::try_from(config).map_err(|e| pull_error(registry, format!("client: {e}")))
    }

    /// The credentials for a registry from the Docker config file, if it
    /// has some; anonymous otherwise.
    fn auth(&self, registry: &str) -> Result<RegistryAuth> {
        let Some(file) = &self.config.auth_file else {
            return Ok(RegistryAuth::Anonymous);
        };
        let text = match std::fs::read(file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(RegistryAuth::Anonymous);
            }
            Err(e) => {
                return Err(pull_error(
                    registry,
                    format!("credentials file {}: {e}", file.display()),
                ));
            }
        };
        docker_config_auth(&text, registry).map_err(|why| {
            pull_error(
                registry,
                format!("credentials file {}: {why}", file.display()),
            )
        })
    }

    /// Pulls the manifest and the one Wasm layer, verifying both.
    async fn pull(&self, pinned: &Pinned) -> Result<(Vec<u8>, Vec<u8>)> {
        let whole = pinned.whole();
        let registry = pinned.reference.resolve_registry().to_owned();
        let client = self.client(&registry)?;
        let auth = self.auth(&registry)?;
        let (manifest, _) = client
            .pull_manifest_raw(&pinned.reference, &auth, &[OCI_MANIFEST])
            .await
            .map_err(|e| pull_error(&whole, e.to_string()))?;
        let manifest = manifest.to_vec();
        let layer = verify_manifest(pinned, &manifest)?;
        let mut out = Capped::default();
        client
            .pull_blob(&pinned.reference, &layer, &mut out)
            .await
            .map_err(|e| pull_error(&whole, format!("layer {}: {e}", layer.digest)))?;
        if out.over {
            return Err(pull_error(
                &whole,
                format!("layer larger than {MAX_POLICY_BYTES} bytes"),
            ));
        }
        verify_layer(pinned, &layer, &out.bytes)?;
        Ok((manifest, out.bytes))
    }

    fn disk_paths(&self, pinned: &Pinned) -> Option<(PathBuf, PathBuf)> {
        let dir = self.disk.as_ref()?;
        let hex = pinned.digest.trim_start_matches("sha256:");
        Some((
            dir.join(format!("{hex}.manifest.json")),
            dir.join(format!("{hex}.wasm")),
        ))
    }

    /// A cached pull, verified again as if it came from the registry.
    fn cached(&self, pinned: &Pinned) -> Option<Vec<u8>> {
        let (manifest_path, wasm_path) = self.disk_paths(pinned)?;
        let manifest = std::fs::read(&manifest_path).ok()?;
        let wasm = std::fs::read(&wasm_path).ok()?;
        let checked = verify_manifest(pinned, &manifest)
            .and_then(|layer| verify_layer(pinned, &layer, &wasm));
        match checked {
            Ok(()) => Some(wasm),
            Err(e) => {
                tracing::warn!(reference = %pinned.whole(), error = %e, "a cached pull failed its check; pulling again");
                let _ = std::fs::remove_file(&manifest_path);
                let _ = std::fs::remove_file(&wasm_path);
                None
            }
        }
    }

    /// Keeps a verified pull on disk: the layer first, the manifest last
    /// (each written to a temporary file and renamed), so a write cut short
    /// leaves nothing that passes the check.
    fn keep(&self, pinned: &Pinned, manifest: &[u8], wasm: &[u8]) {
        let Some((manifest_path, wasm_path)) = self.disk_paths(pinned) else {
            return;
        };
        let write = |path: &Path, bytes: &[u8]| -> std::io::Result<()> {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write(&wasm_path, wasm).and_then(|()| write(&manifest_path, manifest)) {
            tracing::warn!(reference = %pinned.whole(), error = %e, "could not keep the pulled policy on disk");
        }
    }

    /// Pushes a policy as a Wasm OCI artifact to `reference` (a tag, or
    /// none for `latest`) and returns the reference pinned by the
    /// manifest's digest. The manifest has no timestamp: the same policy
    /// pushed twice has the same digest. `contract` is the world the
    /// policy was built against (its manifest's contract annotation).
    pub fn push(&self, wasm: &[u8], name: &str, contract: &str, reference: &str) -> Result<String> {
        let target = Reference::from_str(reference.trim_start_matches("oci://"))
            .map_err(|e| push_error(reference, e))?;
        let layer_digest = sha256(wasm);
        let config = serde_json::json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer_digest],
        });
        let config = Config::new(
            serde_json::to_vec(&config).map_err(|e| push_error(reference, e))?,
            WASM_CONFIG.to_owned(),
            None,
        );
        let layers = [ImageLayer::new(wasm.to_vec(), WASM_LAYER.to_owned(), None)];
        let annotations = BTreeMap::from([
            (
                "org.opencontainers.image.title".to_owned(),
                format!("{name}.wasm"),
            ),
            (
                "io.medik8s.node-maintenance.contract".to_owned(),
                contract.to_owned(),
            ),
        ]);
        let mut manifest = OciImageManifest::build(&layers, &config, Some(annotations));
        manifest.artifact_type = Some(WASM_CONFIG.to_owned());
        let body = serde_json::to_vec(&manifest).map_err(|e| push_error(reference, e))?;
        let digest = sha256(&body);
        let registry = target.resolve_registry().to_owned();
        let client = self.client(&registry)?;
        let auth = self.auth(&registry)?;
        self.block_on(reference, async {
            client
                .store_auth_if_needed(target.resolve_registry(), &auth)
                .await;
            client
                .push_blob(&target, layers[0].data.clone(), &layer_digest)
                .await?;
            client
                .push_blob(&target, config.data.clone(), &manifest.config.digest)
                .await?;
            client
                .push_manifest_raw(&target, body, http::HeaderValue::from_static(OCI_MANIFEST))
                .await
        })?
        .map_err(|e| push_error(reference, e))?;
        let repository = format!("{}/{}", target.registry(), target.repository());
        Ok(format!("{repository}@{digest}"))
    }
}

/// The manifest checked against the pinned digest; its one Wasm layer.
fn verify_manifest(pinned: &Pinned, manifest: &[u8]) -> Result<OciDescriptor> {
    let whole = pinned.whole();
    if manifest.len() > MAX_MANIFEST_BYTES {
        return Err(pull_error(
            &whole,
            format!("manifest larger than {MAX_MANIFEST_BYTES} bytes"),
        ));
    }
    let found = sha256(manifest);
    if found != pinned.digest {
        return Err(pull_error(
            &whole,
            format!(
                "the manifest's digest is {found}, not the pinned {}: refused",
                pinned.digest
            ),
        ));
    }
    let parsed: OciImageManifest = serde_json::from_slice(manifest)
        .map_err(|e| pull_error(&whole, format!("not an OCI image manifest: {e}")))?;
    let wasm: Vec<&OciDescriptor> = parsed
        .layers
        .iter()
        .filter(|l| l.media_type == WASM_LAYER || l.media_type == WASM_TO_OCI_LAYER)
        .collect();
    let [layer] = wasm.as_slice() else {
        let types: Vec<&str> = parsed
            .layers
            .iter()
            .map(|l| l.media_type.as_str())
            .collect();
        return Err(pull_error(
            &whole,
            format!(
                "not a Wasm artifact: it needs exactly one {WASM_LAYER} (or {WASM_TO_OCI_LAYER}) \
                 layer, and has {} ({})",
                wasm.len(),
                types.join(", ")
            ),
        ));
    };
    if layer.size < 0 || layer.size as u64 > MAX_POLICY_BYTES {
        return Err(pull_error(
            &whole,
            format!(
                "layer of {} bytes: at most {MAX_POLICY_BYTES} are accepted",
                layer.size
            ),
        ));
    }
    Ok((*layer).clone())
}

/// The layer's bytes checked against the manifest's digest for it.
fn verify_layer(pinned: &Pinned, layer: &OciDescriptor, bytes: &[u8]) -> Result<()> {
    let found = sha256(bytes);
    if found != layer.digest.to_ascii_lowercase() {
        return Err(pull_error(
            &pinned.whole(),
            format!(
                "the layer's digest is {found}, not the manifest's {}: refused",
                layer.digest
            ),
        ));
    }
    Ok(())
}

/// The credentials a Docker config file holds for a registry.
fn docker_config_auth(text: &[u8], registry: &str) -> std::result::Result<RegistryAuth, String> {
    use base64::Engine as _;
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        auth: Option<String>,
        username: Option<String>,
        password: Option<String>,
    }
    let file: File = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
    let entry = file.auths.iter().find_map(|(key, entry)| {
        let host = key
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or("");
        (host == registry).then_some(entry)
    });
    let Some(entry) = entry else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(user.clone(), password.clone()));
    }
    let Some(auth) = &entry.auth else {
        return Ok(RegistryAuth::Anonymous);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| format!("the auth of {registry} is not base64"))?;
    let decoded =
        String::from_utf8(decoded).map_err(|_| format!("the auth of {registry} is not text"))?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| format!("the auth of {registry} is not user:password"))?;
    Ok(RegistryAuth::Basic(user.to_owned(), password.to_owned()))
}

/// A writer that keeps at most [`MAX_POLICY_BYTES`] and notes when more
/// came.
#[derive(Default)]
struct Capped {
    bytes: Vec<u8>,
    over: bool,
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.bytes.len() as u64 + buf.len() as u64 > MAX_POLICY_BYTES {
            self.over = true;
            return std::task::Poll::Ready(Err(std::io::Error::other(format!(
                "larger than {MAX_POLICY_BYTES} bytes"
            ))));
        }
        self.bytes.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_reference_must_be_pinned_by_a_sha256_digest() {
        let e = Pinned::parse("registry.example/nmo/gentle:v1").unwrap_err();
        assert!(e.to_string().contains("not pinned by digest"), "{e}");
        let e = Pinned::parse("registry.example/nmo/gentle@sha256:abc").unwrap_err();
        assert!(e.to_string().contains("registry.example/nmo/gentle"), "{e}");
        let p = Pinned::parse(&format!("oci://registry.example/nmo/gentle:v1@{D}")).unwrap();
        assert_eq!(p.digest(), D);
    }

    #[test]
    fn loopback_registries_are_plain_http() {
        for r in [
            "localhost:5000",
            "127.0.0.1:5000",
            "127.3.2.1",
            "[::1]:5000",
        ] {
            assert!(is_loopback(r), "{r}");
        }
        for r in [
            "registry.example:5000",
            "10.0.0.1:5000",
            "localhost.example",
        ] {
            assert!(!is_loopback(r), "{r}");
        }
    }

    #[test]
    fn a_manifest_or_layer_that_is_not_what_was_pinned_is_refused() {
        let layer = b"\0asm policy";
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": WASM_CONFIG, "digest": sha256(b"{}"), "size": 2},
            "layers": [{"mediaType": WASM_LAYER, "digest": sha256(layer), "size": layer.len()}],
        });
        let manifest = serde_json::to_vec(&manifest).unwrap();
        let pinned = Pinned::parse(&format!("r.example/p@{}", sha256(&manifest))).unwrap();
        let found = verify_manifest(&pinned, &manifest).unwrap();
        verify_layer(&pinned, &found, layer).unwrap();
        let e = verify_layer(&pinned, &found, b"\0asm other").unwrap_err();
        assert!(e.to_string().contains("not the manifest's"), "{e}");
        let other = Pinned::parse(&format!("r.example/p@{D}")).unwrap();
        let e = verify_manifest(&other, &manifest).unwrap_err();
        assert!(e.to_string().contains("not the pinned"), "{e}");
    }

    #[test]
    fn credentials_come_from_a_docker_config_file() {
        let file = br#"{"auths": {"https://r.example:5000": {"auth": "dXNlcjpzZWNyZXQ="},
                        "other.example": {"username": "u", "password": "p"}}}"#;
        match docker_config_auth(file, "r.example:5000").unwrap() {
            RegistryAuth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("user", "secret")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            docker_config_auth(file, "other.example").unwrap(),
            RegistryAuth::Basic(..)
        ));
        assert!(matches!(
            docker_config_auth(file, "third.example").unwrap(),
            RegistryAuth::Anonymous
        ));
        assert!(docker_config_auth(b"{", "r.example").is_err());
    }
}
