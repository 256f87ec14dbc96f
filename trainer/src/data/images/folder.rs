//! The listing of an image folder in torchvision's `ImageFolder` layout: one folder per class
//! under the root, the images of a class anywhere below its folder.
//!
//! The order is torchvision's, so that a class id and a sample index mean the same image in
//! Ingot and in PyTorch: class folders sorted by name (class `k` is the `k`-th), and within a
//! class the folders below it sorted by path (`sorted(os.walk(...))`) and each folder's files
//! sorted by name. Names sort by their bytes, which for UTF-8 names is Python's code-point order.
//! Symbolic links are followed, as torchvision does (`followlinks=True`).
//!
//! Only `.jpg`, `.jpeg` and `.png` files are images here (any case); other files are not read.

use crate::data::error::DataError;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// How deep class folders may nest (a deeper tree is taken for a loop of symbolic links).
const MAX_DEPTH: usize = 64;

/// An image folder's classes and files, listed once when it is opened.
#[derive(Debug)]
pub struct ImageFolder {
    root: PathBuf,
    /// The class folders' names, in class-id order.
    classes: Vec<OsString>,
    /// Every image, by class then path; each is `(class, path relative to the root)`.
    files: Vec<(u32, Box<Path>)>,
}

/// Whether `name` is a file this loader decodes.
pub(crate) fn is_image_name(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy().to_ascii_lowercase();
    [".jpg", ".jpeg", ".png"].iter().any(|e| name.ends_with(e))
}

/// The entries of `dir`, each with whether it is a directory (following links), sorted by name.
fn entries(dir: &Path) -> Result<Vec<(OsString, bool)>, DataError> {
    let io = |e| DataError::io(dir, "the folder's entries", e);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let path = entry.path();
        // Follows links; an entry that vanished or is a broken link is a file (not an image
        // folder), left to the decoder to report if it is named as an image.
        let is_dir = std::fs::metadata(&path).is_ok_and(|m| m.is_dir());
        out.push((entry.file_name(), is_dir));
    }
    out.sort_by(|a, b| a.0.as_encoded_bytes().cmp(b.0.as_encoded_bytes()));
    Ok(out)
}

/// Every folder at or below `dir` (relative to `root`), depth first.
fn folders_below(
    root: &Path,
    rel: PathBuf,
    depth: usize,
    out: &mut Vec<PathBuf>,
) -> Result<(), DataError> {
    let dir = root.join(&rel);
    if depth > MAX_DEPTH {
        return Err(DataError::format(
            &dir,
            "the folder tree",
            format!("folders nest more than {MAX_DEPTH} deep (a loop of symbolic links?)"),
        ));
    }
    for (name, is_dir) in entries(&dir)? {
        if is_dir {
            folders_below(root, rel.join(name), depth + 1, out)?;
        }
    }
    out.push(rel);
    Ok(())
}

impl ImageFolder {
    /// Lists the folder at `root`. A root with no class folder, or a class folder with no
    /// image, is an error naming it (as torchvision's `ImageFolder` refuses both).
    pub fn open(root: &Path) -> Result<ImageFolder, DataError> {
        let classes: Vec<OsString> = entries(root)?
            .into_iter()
            .filter(|(_, is_dir)| *is_dir)
            .map(|(name, _)| name)
            .collect();
        let refused = |reason: &str| Err(DataError::format(root, "the image folder", reason));
        if classes.is_empty() {
            return refused(
                "it holds no class folder: an image folder holds one folder of .jpg/.jpeg/.png images per class (torchvision's ImageFolder layout), a sample set holds x.npy and y.npy",
            );
        }
        if classes.len() > u32::MAX as usize {
            return refused("too many classes");
        }
        let mut files = Vec::new();
        for (k, class) in classes.iter().enumerate() {
            let mut folders = Vec::new();
            folders_below(root, PathBuf::from(class), 0, &mut folders)?;
            folders.sort_by(|a, b| {
                a.as_os_str()
                    .as_encoded_bytes()
                    .cmp(b.as_os_str().as_encoded_bytes())
            });
            let before = files.len();
            for rel in folders {
                for (name, is_dir) in entries(&root.join(&rel))? {
                    if !is_dir && is_image_name(&name) {
                        files.push((k as u32, rel.join(name).into_boxed_path()));
                    }
                }
            }
            if files.len() == before {
                return Err(DataError::format(
                    &root.join(class),
                    "class folder",
                    "it holds no .jpg, .jpeg or .png image; every class folder of an image folder needs at least one (remove the folder or add its images)",
                ));
            }
        }
        if files.len() > u32::MAX as usize {
            return Err(DataError::format(
                root,
                "the image folder",
                format!(
                    "{} images is more than the {} supported",
                    files.len(),
                    u32::MAX
                ),
            ));
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            files,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The class folders' names, in class-id order.
    pub fn classes(&self) -> Vec<String> {
        self.classes
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect()
    }

    /// Images in the folder.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Image `i`'s path and class id.
    pub fn sample(&self, i: usize) -> (PathBuf, u32) {
        let (class, rel) = &self.files[i];
        (self.root.join(rel), *class)
    }

    /// A hash of the listing (every relative path and class) and of the first 64 KiB of up to
    /// 16 images spread evenly over it: what identifies the folder when a run resumes, without
    /// reading a million files. FNV-1a-64, as [`crate::datasets::dataset_fingerprint`].
    pub fn fingerprint(&self) -> Result<u64, DataError> {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                hash = (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        };
        for (class, rel) in &self.files {
            eat(&class.to_le_bytes());
            eat(rel.as_os_str().as_encoded_bytes());
            eat(&[0]);
        }
        let n = self.files.len();
        let picks = n.min(16);
        let mut block = vec![0u8; 64 << 10];
        for k in 0..picks {
            let i = if picks == 1 {
                0
            } else {
                k * (n - 1) / (picks - 1)
            };
            let (path, _) = self.sample(i);
            // An unreadable image is skipped when it is met; here it only changes the hash.
            if let Ok(mut f) = std::fs::File::open(&path) {
                use std::io::Read;
                let got = f.read(&mut block).unwrap_or(0);
                eat(&block[..got]);
            }
        }
        Ok(hash)
    }
}
