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

/// The GEMMs of a CUDA program, in program order.
pub fn gemms(p: &cuda::Program) -> Vec<&cuda::Gemm> {
    p.ops
        .iter()
        .filter_map(|op| match op {
            cuda::DeviceOp::Gemm(g) => Some(g),
            _ => None,
        })
        .collect()
}

/// The convolution passes of a CUDA program, in program order.
pub fn convs(p: &cuda::Program) -> Vec<&cuda::Conv> {
    p.ops
        .iter()
        .filter_map(|op| match op {
            cuda::DeviceOp::Conv(c) => Some(c),
            _ => None,
        })
        .collect()
}
