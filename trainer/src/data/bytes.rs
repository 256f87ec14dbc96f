//! Any file as byte-level tokens: each byte is one token id in `0..256`, written as raw
//! little-endian `uint16` so that the result reads back as a token stream
//! ([`super::TokenStream`], format raw uint16) for a GPT with vocabulary 256.

/// The vocabulary of byte-level tokens.
pub const BYTE_VOCAB: u64 = 256;

/// The raw `uint16` token file of `bytes`: two bytes per input byte.
pub fn byte_tokens(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.extend_from_slice(&(b as u16).to_le_bytes());
    }
    out
}
