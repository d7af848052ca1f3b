//! Content digests: SHA-256 as lowercase hex.

use sha2::{Digest, Sha256};

/// The SHA-256 of `bytes`, as lowercase hex.
pub fn hex_digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
