//! Finding a shared library the GPU machines keep outside the loader's path, and loading it by
//! absolute path so that later `dlopen`s of its name find it.
//!
//! NVIDIA's libraries often come with PyTorch as Python packages (`nvidia/nccl/lib/libnccl.so.2`,
//! `nvidia/cudnn/lib/libcudnn.so.9` in site-packages), not in a directory the dynamic loader
//! searches. [`find`] looks, in order: the directory named by the library's own environment
//! variable (`INGOT_NCCL_DIR`), every directory of `LD_LIBRARY_PATH`, then each Python
//! site-packages directory (of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the usual system and user
//! prefixes, and what `python3` itself reports) joined with the package's subdirectories, then
//! the system library directories. Not found is an error listing every directory looked in.
//! [`preload`] opens the file with `RTLD_GLOBAL` and keeps it open for the process's life.

use std::path::{Path, PathBuf};

/// What to look for.
#[derive(Clone, Copy, Debug)]
pub struct Library {
    /// The file name, e.g. `libnccl.so.2`.
    pub file: &'static str,
    /// The environment variable naming a directory that holds it, e.g. `INGOT_NCCL_DIR`.
    pub env_dir: &'static str,
    /// Where the file lies inside a Python site-packages directory, e.g. `nvidia/nccl/lib`.
    pub python_subdirs: &'static [&'static str],
    /// What to tell a user who has none (how to get it).
    pub install_hint: &'static str,
}

/// The library was in none of the directories looked in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file} was not found; looked in {}: {hint}", looked_in(.looked))]
pub struct NotFound {
    pub file: String,
    pub looked: Vec<PathBuf>,
    pub hint: String,
}

fn looked_in(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no directory".into();
    }
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The directories [`find`] looks in, in order, without duplicates; `env` reads environment
/// variables and `python_site` gives the site-packages directories Python reports (both
/// injectable, so the order is tested without touching the process's environment).
pub fn directories(
    lib: &Library,
    env: &dyn Fn(&str) -> Option<String>,
    python_site: &dyn Fn() -> Vec<PathBuf>,
) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = env(lib.env_dir).filter(|d| !d.is_empty()) {
        dirs.push(d.into());
    }
    if let Some(p) = env("LD_LIBRARY_PATH") {
        dirs.extend(p.split(':').filter(|d| !d.is_empty()).map(PathBuf::from));
    }
    let mut sites: Vec<PathBuf> = Vec::new();
    let prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| env(v))
        .map(PathBuf::from)
        .chain(
            ["/opt/conda", "/usr/local", "/usr"]
                .iter()
                .map(PathBuf::from),
        )
        .chain(env("HOME").map(|h| Path::new(&h).join(".local")))
        .collect();
    for prefix in prefixes {
        sites.extend(python_dirs(&prefix.join("lib")));
    }
    sites.extend(python_site());
    for site in sites {
        for sub in lib.python_subdirs {
            dirs.push(site.join(sub));
        }
    }
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/local/lib",
            "/usr/lib",
        ]
        .iter()
        .map(PathBuf::from),
    );
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// `lib_dir/python3.*/{site,dist}-packages` that exist, sorted (the newest Python last).
fn python_dirs(lib_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(lib_dir) else {
        return out;
    };
    let mut pythons: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("python3"))
        })
        .collect();
    pythons.sort();
    for p in pythons {
        for kind in ["site-packages", "dist-packages"] {
            let d = p.join(kind);
            if d.is_dir() {
                out.push(d);
            }
        }
    }
    out
}

/// The site-packages directories `python3` reports (none when there is no `python3`).
pub fn python_site_packages() -> Vec<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// The first of `dirs` holding `lib.file`.
pub fn find_in(lib: &Library, dirs: Vec<PathBuf>) -> Result<PathBuf, NotFound> {
    for d in &dirs {
        let f = d.join(lib.file);
        if f.is_file() {
            return Ok(f);
        }
    }
    Err(NotFound {
        file: lib.file.into(),
        looked: dirs,
        hint: lib.install_hint.into(),
    })
}

/// Where `lib` is on this machine (see the module docs for the order).
pub fn find(lib: &Library) -> Result<PathBuf, NotFound> {
    let dirs = directories(lib, &|v| std::env::var(v).ok(), &python_site_packages);
    find_in(lib, dirs)
}

/// Opens `path` with `RTLD_NOW | RTLD_GLOBAL` and keeps it loaded for the rest of the
/// process: its symbols serve later lookups, and a `dlopen` of its soname finds it.
pub fn preload(path: &Path) -> Result<&'static libloading::Library, String> {
    use libloading::os::unix::{Library as Unix, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading a shared library runs its initialisers; these are NVIDIA's libraries,
    // found by name in the directories above.
    let lib = unsafe { Unix::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|e| format!("{}: cannot be loaded: {e}", path.display()))?;
    Ok(Box::leak(Box::new(libloading::Library::from(lib))))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: Library = Library {
        file: "libtest.so.2",
        env_dir: "INGOT_TEST_DIR",
        python_subdirs: &["nvidia/test/lib"],
        install_hint: "install it",
    };

    #[test]
    fn the_own_variable_comes_first_then_ld_library_path_then_python_packages() {
        let env = |v: &str| match v {
            "INGOT_TEST_DIR" => Some("/own".to_string()),
            "LD_LIBRARY_PATH" => Some("/a::/b".to_string()),
            _ => None,
        };
        let dirs = directories(&LIB, &env, &|| vec![PathBuf::from("/site")]);
        assert_eq!(dirs[..3], [PathBuf::from("/own"), "/a".into(), "/b".into()]);
        let site = dirs
            .iter()
            .position(|d| d == Path::new("/site/nvidia/test/lib"))
            .expect("python's site-packages joined with the package directory");
        let system = dirs
            .iter()
            .position(|d| d == Path::new("/usr/lib"))
            .unwrap();
        assert!(site < system, "packages before the system directories");
    }

    #[test]
    fn a_library_in_none_of_the_directories_is_an_error_naming_each() {
        let e = find_in(&LIB, vec!["/nowhere/a".into(), "/nowhere/b".into()]).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("libtest.so.2")
                && m.contains("/nowhere/a, /nowhere/b")
                && m.contains("install it"),
            "{m}"
        );
    }

    #[test]
    fn the_first_directory_holding_the_file_wins() {
        let base = std::env::temp_dir().join(format!("ingot-libsearch-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        for d in [&a, &b] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join(LIB.file), b"").unwrap();
        }
        let empty = base.join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        let got = find_in(&LIB, vec![empty, b.clone(), a]).unwrap();
        assert_eq!(got, b.join(LIB.file));
        let _ = std::fs::remove_dir_all(&base);
    }
}
