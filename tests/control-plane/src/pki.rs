//! The control plane's own CA, serving certificate, service-account key and
//! static tokens, made fresh for each control plane.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use crate::ControlPlaneError;

/// A static token user of the API server's `--token-auth-file`.
#[derive(Debug, Clone)]
pub struct TokenUser {
    pub token: String,
    pub user: String,
    pub groups: Vec<String>,
}

pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    pub(crate) tokens: Vec<TokenUser>,
}

/// A random token (32 hex digits) from the system's randomness.
pub(crate) fn random_token() -> Result<String, ControlPlaneError> {
    let mut buf = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| ControlPlaneError::io(Path::new("/dev/urandom"), e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `ca.crt`, `serving.crt`/`serving.key` (127.0.0.1, localhost, the
/// in-cluster names and addresses), `sa.key`/`sa.pub` and `tokens.csv` into `dir`.
pub(crate) fn write(dir: &Path, users: &[(&str, &[&str])]) -> Result<Pki, ControlPlaneError> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "nmo test control plane CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let serving_key = KeyPair::generate()?;
    let mut serving = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        // In-cluster clients on a real node dial the `kubernetes`
        // Service's cluster IP (the range's first address), or the
        // address the API server advertises.
        "10.96.0.1".to_owned(),
        crate::node::APISERVER_ADDRESS.to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default".to_owned(),
        "kubernetes.default.svc".to_owned(),
        "kubernetes.default.svc.cluster.local".to_owned(),
    ])?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let serving_cert = serving.signed_by(&serving_key, &issuer)?;

    let sa_key = KeyPair::generate()?;

    let mut tokens = Vec::new();
    let mut csv = String::new();
    for (i, (user, groups)) in users.iter().enumerate() {
        let token = random_token()?;
        csv.push_str(&format!(
            "{token},{user},uid-{i},\"{}\"\n",
            groups.join(",")
        ));
        tokens.push(TokenUser {
            token,
            user: (*user).to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        });
    }

    let ca_pem = ca_cert.pem();
    for (name, text) in [
        ("ca.crt", ca_pem.clone()),
        ("serving.crt", serving_cert.pem()),
        ("serving.key", serving_key.serialize_pem()),
        ("sa.key", sa_key.serialize_pem()),
        ("sa.pub", sa_key.public_key_pem()),
        ("tokens.csv", csv),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| ControlPlaneError::io(&path, e))?;
    }
    Ok(Pki { ca_pem, tokens })
}
