//! Executable files made by hand, for the tests that damage them.

use ingot_compiler::exe::{self, VERSION};

/// `payload` behind a header that is right for it (magic, version, length, checksum), so that
/// only the payload's own checks (JSON, graph, plan) see what a test did to it.
pub fn sealed(payload: &[u8]) -> Vec<u8> {
    let mut f = exe::MAGIC.to_vec();
    f.extend_from_slice(&VERSION.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    f.extend_from_slice(&exe::fnv1a64(payload).to_le_bytes());
    f.extend_from_slice(payload);
    f
}
