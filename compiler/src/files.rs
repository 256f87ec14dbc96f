//! Files Ingot reads and writes, handled so that no input reads forever and no crash leaves a
//! half-written file where a good one was.
//!
//! - [`write_atomically`]: every file Ingot writes (weights, executables, offset solutions,
//!   pictures) goes to a temporary name beside the target, is synced, and is renamed over the
//!   target, so the target holds either its old bytes or all the new ones.
//! - [`check_writable`]: output paths are checked before the work that produces them starts
//!   (a training run, a solve), so a bad `--save` is found in a second, not after the run.
//! - [`read_capped`]: inputs are read up to a cap, so `/dev/zero` or a runaway pipe is an error.
//! - [`same_file`]: an output path is refused when it names an input (or another output), by
//!   device and inode where the file exists, so `--report data.bin` cannot replace the data.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Temporary files of this process get distinct names: `.NAME.PID.N.tmp` beside the target.
static TEMPORARY: AtomicU64 = AtomicU64::new(0);

/// The directory a file at `path` lives in (`.` for a bare file name).
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A fresh temporary name beside `path`.
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ingot".into());
    let n = TEMPORARY.fetch_add(1, Ordering::Relaxed);
    parent(path).join(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// What a write to `path` replaces: the file a symbolic link points to (the link stays), or
/// `path` itself.
fn resolve(path: &Path) -> PathBuf {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
        }
        _ => path.to_path_buf(),
    }
}

/// True when `path` exists and is neither a regular file nor a directory (`/dev/null`, a FIFO, a
/// terminal): such a target is written in place, since renaming over it would replace it.
fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// Writes `bytes` to `path` atomically: to a temporary file in the same directory, synced to
/// disk, then renamed over `path` (and the directory synced, where the OS allows). On any error
/// the temporary file is removed and `path` is untouched. A symbolic link is followed (the file
/// it points to is replaced); a device or FIFO (`/dev/null`) is written in place.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if path.is_dir() {
        return Err(std::io::Error::other("it is a directory"));
    }
    if is_special(path) {
        return std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .write_all(bytes);
    }
    let path = &resolve(path);
    let tmp = temporary_beside(path);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // The rename is durable once the directory is synced; not every OS lets a directory be
    // opened for that, and the file's own bytes are already on disk, so this is best effort.
    if let Ok(dir) = std::fs::File::open(parent(path)) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Checks that a file can be written at `path` by creating and removing a temporary file
/// beside it (the same operation [`write_atomically`] will do): the directory must exist and
/// be writable, and `path` must not be a directory.
pub fn check_writable(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        return Err(std::io::Error::other("it is a directory"));
    }
    if is_special(path) {
        // Written in place; opening a FIFO here could block until a reader comes.
        return Ok(());
    }
    let path = &resolve(path);
    let tmp = temporary_beside(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)?;
    std::fs::remove_file(&tmp)
}

/// The file a path names, for comparing two paths: the (device, inode) pair of an existing file
/// (through symbolic links, hard links and `..` alike), else the absolute path of the file it
/// would create (its existing parent canonicalised, then its name).
#[derive(Debug, PartialEq, Eq)]
enum FileKey {
    Inode(u64, u64),
    Path(PathBuf),
}

fn file_key(path: &Path) -> Option<FileKey> {
    #[cfg(unix)]
    if let Ok(m) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt;
        return Some(FileKey::Inode(m.dev(), m.ino()));
    }
    #[cfg(not(unix))]
    if path.exists() {
        return std::fs::canonicalize(path).ok().map(FileKey::Path);
    }
    let name = path.file_name()?;
    let dir = std::fs::canonicalize(parent(path)).ok()?;
    Some(FileKey::Path(dir.join(name)))
}

/// True when `a` and `b` name the same file: the same existing file by any path (a link, a
/// hard link, `./x` and `x`), or the same file to be created. Two paths that cannot be
/// resolved (a missing directory) are compared as written.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (file_key(a), file_key(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Reads the file at `path`, refusing one longer than `cap` bytes (`/dev/zero`, a pipe that does
/// not end) with an error saying so, instead of reading without end.
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    f.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::other(format!(
            "it is longer than the {cap} bytes (at most) Ingot reads from such a file"
        )));
    }
    Ok(bytes)
}

/// FNV-1a, 64 bits: a step executable's checksum and a lowered program's fingerprint (it
/// detects accidental damage and change, not tampering).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ingot-files-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let d = scratch("replace");
        let p = d.join("w.bin");
        std::fs::write(&p, b"old").unwrap();
        write_atomically(&p, b"new bytes").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new bytes");
        assert!(leftovers(&d).is_empty(), "{:?}", leftovers(&d));
    }

    #[test]
    fn a_failed_atomic_write_leaves_the_old_file_as_it_was() {
        let d = scratch("fail");
        // The target is a directory: nothing may be renamed over it.
        let p = d.join("sub");
        std::fs::create_dir(&p).unwrap();
        assert!(write_atomically(&p, b"x").is_err());
        assert!(p.is_dir());
        assert!(leftovers(&d).is_empty());
        // The directory does not exist: an error, nothing written.
        assert!(write_atomically(&d.join("missing/w.bin"), b"x").is_err());
    }

    #[test]
    fn a_path_in_a_missing_directory_or_naming_a_directory_is_not_writable() {
        let d = scratch("writable");
        assert!(check_writable(&d.join("ok.bin")).is_ok());
        assert!(
            !d.join("ok.bin").exists(),
            "the check leaves nothing behind"
        );
        assert!(leftovers(&d).is_empty());
        assert!(check_writable(&d.join("no/such/dir/w.bin")).is_err());
        assert!(check_writable(&d).is_err());
    }

    #[test]
    fn a_device_is_written_in_place_and_a_symlink_keeps_pointing_at_the_new_file() {
        if Path::new("/dev/null").exists() {
            check_writable(Path::new("/dev/null")).unwrap();
            write_atomically(Path::new("/dev/null"), b"gone").unwrap();
            assert!(!std::fs::metadata("/dev/null").unwrap().is_file());
        }
        #[cfg(unix)]
        {
            let d = scratch("symlink");
            let (real, link) = (d.join("real.bin"), d.join("link.bin"));
            std::fs::write(&real, b"old").unwrap();
            std::os::unix::fs::symlink(&real, &link).unwrap();
            write_atomically(&link, b"new").unwrap();
            assert!(std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink());
            assert_eq!(std::fs::read(&real).unwrap(), b"new");
            assert!(leftovers(&d).is_empty());
        }
    }

    #[test]
    fn two_paths_to_one_file_are_the_same_file_and_two_files_are_not() {
        let d = scratch("same");
        let (a, b) = (d.join("a.bin"), d.join("b.bin"));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        assert!(same_file(&a, &a));
        assert!(same_file(&a, &d.join(".").join("a.bin")));
        assert!(!same_file(&a, &b));
        // A file not yet written is the same as itself by another spelling, not as another.
        let new = d.join("new.bin");
        std::fs::create_dir(d.join("sub")).unwrap();
        assert!(same_file(&new, &d.join("sub/../new.bin")));
        assert!(!same_file(&new, &a));
        #[cfg(unix)]
        {
            let (link, hard) = (d.join("link.bin"), d.join("hard.bin"));
            std::os::unix::fs::symlink(&a, &link).unwrap();
            std::fs::hard_link(&a, &hard).unwrap();
            assert!(same_file(&link, &a), "a symbolic link names its target");
            assert!(same_file(&hard, &a), "a hard link is the same inode");
        }
    }

    #[test]
    fn reading_stops_at_the_cap_with_an_error() {
        let d = scratch("cap");
        let p = d.join("big");
        std::fs::write(&p, vec![b'a'; 100]).unwrap();
        assert_eq!(read_capped(&p, 100).unwrap().len(), 100);
        let e = read_capped(&p, 99).unwrap_err().to_string();
        assert!(e.contains("99 bytes"), "{e}");
        if Path::new("/dev/zero").exists() {
            assert!(read_capped(Path::new("/dev/zero"), 1 << 20).is_err());
        }
    }
}
