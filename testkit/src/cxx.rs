//! The host's C++ compiler, for the kernel tests that compile generated CUDA C for the host (a
//! syntax check, or an emulation run thread by thread) so that CI checks the GPU's code
//! without a GPU. One discovery, looked up once per test binary.

use std::process::Command;
use std::sync::OnceLock;

/// The compilers tried, in this order.
pub const CANDIDATES: [&str; 3] = ["g++", "c++", "clang++"];

/// The first of [`CANDIDATES`] that runs (`--version` succeeds), or `None` where none does.
pub fn host_cxx() -> Option<&'static str> {
    static FOUND: OnceLock<Option<&'static str>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        CANDIDATES.into_iter().find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
    })
}

/// [`host_cxx`], saying on stderr that the caller skips where there is none: a test without a
/// C++ compiler passes, and says so.
pub fn host_cxx_or_skip() -> Option<&'static str> {
    let found = host_cxx();
    if found.is_none() {
        eprintln!(
            "skipping: no C++ compiler (tried {})",
            CANDIDATES.join(", ")
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiler_found_is_one_of_the_candidates_and_the_same_every_time() {
        let first = host_cxx();
        assert!(first.is_none_or(|c| CANDIDATES.contains(&c)), "{first:?}");
        assert_eq!(host_cxx(), first);
    }
}
