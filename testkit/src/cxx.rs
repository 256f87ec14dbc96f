//! The host's C++ compiler, for the kernel tests that compile generated CUDA C for the host (a
//! syntax check, or an emulation run thread by thread) so that CI checks the GPU's code
//! without a GPU. One discovery, looked up once per test binary.

use ingot_kernels::cuda::CudaKernel;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// What every host shim of the kernel tests defines of CUDA, after its own includes: the
/// function and memory qualifiers defined away (a block's shared memory becomes static), and the
/// bit casts between float and integer registers as `memcpy`s (`static inline`: a program that
/// uses none of them compiles without a warning, as the bf16 helpers' does under `-Werror`).
/// One text, so that a kernel that compiles under one emulation's shim compiles under the
/// others'.
pub const CUDA_ON_HOST: &str = r#"#include <string.h>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
"#;

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

/// Writes `src` to the file `name` in the directory `dir` (with the process id appended: test
/// binaries run at once) of the system's temporary directory, and compiles it with `cxx` and
/// `flags`, into a program beside it (`name` without its extension) unless the flags hold
/// `-fsyntax-only`. Returns the program's path (the source's where no program is built), or
/// where the compiler fails, the source's path and the compiler's stderr.
pub fn compile(
    cxx: &str,
    dir: &str,
    name: &str,
    src: &str,
    flags: &[&str],
) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("{dir}_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, src).unwrap();
    let mut command = Command::new(cxx);
    command.args(flags);
    let built = if flags.contains(&"-fsyntax-only") {
        file.clone()
    } else {
        let exe = file.with_extension("");
        command.arg("-o").arg(&exe);
        exe
    };
    let out = command
        .arg(&file)
        .output()
        .expect("running the C++ compiler");
    if out.status.success() {
        Ok(built)
    } else {
        Err(format!(
            "{}:\n{}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Appends each kernel's source once (the first of a name), then an emulation's table of
/// runners, `static Runner KERNELS[]`, an entry a kernel calling it through the emulation's
/// `call`. Returns the kernels' names in the table's order.
pub fn append_kernel_table<'a>(
    src: &mut String,
    kernels: impl IntoIterator<Item = &'a CudaKernel>,
) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for k in kernels {
        if !names.contains(&k.name) {
            names.push(k.name.clone());
            src.push_str(&k.source);
        }
    }
    src.push_str("static Runner KERNELS[] = {\n");
    for n in &names {
        src.push_str(&format!("  [](void** b) {{ call({n}, b); }},\n"));
    }
    src.push_str("};\n");
    names
}

/// A host program that emulates generated kernels thread by thread: its path, and its kernels'
/// names in the order of its table of runners (a kernel's index there is the program's argument).
pub struct Emu {
    /// The program.
    pub exe: PathBuf,
    /// The kernels' names, in the table's order.
    pub names: Vec<String>,
}

impl Emu {
    /// `head` (the emulation's shim and the prelude its kernels need), each kernel once with the
    /// table of runners ([`append_kernel_table`]), then `main`, compiled into `dir`
    /// ([`compile`]) as the emulations are: `-O1`, no multiply-adds contracted, no warnings.
    pub fn build<'a>(
        cxx: &str,
        dir: &str,
        head: &str,
        kernels: impl IntoIterator<Item = &'a CudaKernel>,
        main: &str,
    ) -> Result<Emu, String> {
        let mut src = head.to_string();
        let names = append_kernel_table(&mut src, kernels);
        src.push_str(main);
        let flags = ["-std=c++17", "-O1", "-ffp-contract=off", "-w"];
        let exe = compile(cxx, dir, "emu.cpp", &src, &flags)?;
        Ok(Emu { exe, names })
    }

    /// Runs `k` (by its index in the table) with `input` on stdin, which begins as
    /// [`launch_input`] does; returns stdout. Panics, naming the kernel, where the program fails.
    pub fn run(&self, k: &CudaKernel, input: Vec<u8>) -> Vec<u8> {
        let which = self.names.iter().position(|n| *n == k.name).unwrap();
        let out = run_fed(&self.exe, &[&which.to_string()], input);
        assert!(
            out.status.success(),
            "emulated {} failed: {}",
            k.name,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

/// What the emulations' programs read first: the launch's grid and block sizes along x, the
/// number of buffers, and each buffer (its length, then its bytes), as 64-bit native integers.
pub fn launch_input(k: &CudaKernel, bufs: &[Vec<u8>]) -> Vec<u8> {
    let mut stdin = Vec::new();
    for x in [k.launch.grid[0], k.launch.block[0], bufs.len() as u32] {
        stdin.extend(u64::from(x).to_ne_bytes());
    }
    for b in bufs {
        stdin.extend((b.len() as u64).to_ne_bytes());
        stdin.extend(b);
    }
    stdin
}

/// Runs `exe` with `args`, its stdin fed `input` from another thread (so that a program that
/// writes before it has read everything cannot block), and returns its output.
pub fn run_fed(exe: &Path, args: &[&str], input: Vec<u8>) -> Output {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(&input).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// `bytes` cut into consecutive pieces of the lengths of `like`'s buffers.
pub fn split_like(bytes: &[u8], like: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut at = 0;
    like.iter()
        .map(|b| {
            let v = bytes[at..at + b.len()].to_vec();
            at += b.len();
            v
        })
        .collect()
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
