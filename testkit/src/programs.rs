//! What tests read off a lowered executable: its CUDA program (compiling for CUDA needs no GPU,
//! so the CPU-only suites check CUDA lowering too), without each test matching the program's
//! backend by hand.

use ingot_compiler::exe::Executable;
use ingot_compiler::lower::{cuda, Program};

/// The CUDA program of `exe`; the test fails where `exe` was lowered for another target.
pub fn cuda_program(exe: &Executable) -> &cuda::Program {
    match exe.program() {
        Program::Cuda(p) => p,
        Program::Cpu(_) => panic!("a CPU program, not a CUDA one"),
    }
}
