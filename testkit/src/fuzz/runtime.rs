//! The runtime's fuzz body: the safetensors reader.

use ingot_runtime::io;
use std::path::Path;

/// The safetensors reader ([`io::from_bytes`]): arbitrary bytes are tensors or an error naming
/// the file; tensors it reads write out ([`io::to_bytes`]) as bytes that read back and write out
/// to the same bytes.
pub fn safetensors(data: &[u8]) {
    let path = Path::new("fuzz.safetensors");
    let tensors = match io::from_bytes(data, path) {
        Ok(t) => t,
        Err(e) => {
            assert_eq!(e.path(), path, "an error names another file: {e}");
            return;
        }
    };
    let bytes = io::to_bytes(&tensors, path)
        .unwrap_or_else(|e| panic!("tensors that were read cannot be written: {e}"));
    let again = io::from_bytes(&bytes, path)
        .unwrap_or_else(|e| panic!("written tensors do not read back: {e}"));
    let names = |t: &indexmap::IndexMap<String, ingot_runtime::Tensor>| -> Vec<String> {
        t.keys().cloned().collect()
    };
    assert_eq!(
        names(&again),
        names(&tensors),
        "names or their order changed"
    );
    let bytes2 = io::to_bytes(&again, path).expect("written once already");
    assert!(
        bytes == bytes2,
        "the file's bytes change on a second round trip"
    );
}
