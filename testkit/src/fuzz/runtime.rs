//! The runtime's fuzz body: the safetensors reader.

use ingot_runtime::io;
use std::path::Path;

/// The safetensors reader ([`io::from_bytes`]): arbitrary bytes are tensors or an error naming
/// the file; tensors it reads write out ([`io::to_bytes`]) as bytes that read back and write out
/// to the same bytes, holding the same names and tensors.
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
    // The writer lays tensors out in its own order (safetensors sorts them by alignment and
    // name) and the reader returns them in the file's data order, so the names compare as a
    // set; each tensor must come back with its type and bits.
    let mut names: Vec<&String> = tensors.keys().collect();
    let mut names_again: Vec<&String> = again.keys().collect();
    names.sort();
    names_again.sort();
    assert_eq!(names_again, names, "the names changed");
    for (name, t) in &tensors {
        let back = &again[name];
        assert!(
            back.ty == t.ty && back.to_le_bytes() == t.to_le_bytes(),
            "tensor {name:?} changed: {} read back as {}",
            t.ty,
            back.ty
        );
    }
    let bytes2 = io::to_bytes(&again, path).expect("written once already");
    assert!(
        bytes == bytes2,
        "the file's bytes change on a second round trip"
    );
}
