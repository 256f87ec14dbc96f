//! GEMMs with a bias epilogue ([`Epilogue`](ingot_compiler::lower::cuda::Epilogue)) through
//! cuBLASLt: one matmul descriptor, its layouts and the algorithm cuBLASLt's heuristic picks
//! within the GEMM's planned workspace, made once at load; each step then enqueues
//! `cublasLtMatmul`. Where the epilogue's bias is an f32 parameter rounded to bf16 (a bf16
//! GEMM's, [`Round`](ingot_compiler::lower::cuda::Round)), its rounding kernel is launched
//! first, into the tail of the GEMM's workspace, and cuBLASLt is given the rest
//! ([`Gemm::library_workspace`]).
//!
//! The epilogues run only where `INGOT_GEMM_EPILOGUE=1` is set: measured on an H200 (docs/
//! benchmarks.md, session 42), gpt2's tf32 step took 40.56 ms with them against 38.90 ms
//! without (one run each), so they stay a choice until measured faster. Otherwise, and where
//! cuBLASLt is not there or refuses the epilogue (no algorithm for its types), the GEMM runs
//! through cuBLAS as any other and the absorbed kernel's launch after it (the epilogue's
//! fallback): OLD's operations exactly. When asked for, what ran is printed once at load.

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use ingot_compiler::ir::{DType, NodeId};
use ingot_compiler::lower::cuda::{Compute, DeviceOp, Epilogue, Gemm, Program};
use std::collections::HashMap;
use std::ffi::c_void;

/// The environment variable that turns the epilogues on (`1`); otherwise their fallbacks run.
pub const SWITCH: &str = "INGOT_GEMM_EPILOGUE";

/// A cuBLASLt handle.
pub(super) struct Handle(sys::cublasLtHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a live handle, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// One GEMM's cuBLASLt call, ready to enqueue.
pub(super) struct LtGemm {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
    /// The workspace the algorithm needs (within the planned one).
    workspace: usize,
}

impl Drop for LtGemm {
    fn drop(&mut self) {
        // SAFETY: descriptors made by `plan`, destroyed once.
        unsafe {
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// Whether the epilogues may run, by `INGOT_GEMM_EPILOGUE` (`1`: yes; unset or else: no).
pub fn enabled(setting: Option<&std::ffi::OsStr>) -> bool {
    setting.is_some_and(|v| v == "1")
}

/// A cuBLASLt handle where some program has a GEMM with an epilogue, the switch asks for
/// them and cuBLASLt loads; else `None` (and, when asked for, why: printed), so their
/// fallbacks run.
pub(super) fn handle(programs: &[&Program]) -> Option<Handle> {
    let any = programs
        .iter()
        .flat_map(|p| p.all_ops())
        .any(|op| matches!(op, DeviceOp::Gemm(g) if g.epilogue.is_some()));
    if !any || !enabled(std::env::var_os(SWITCH).as_deref()) {
        return None;
    }
    // SAFETY: only tries to open the library.
    let why = if !unsafe { sys::is_culib_present() } {
        "libcublasLt was not found".into()
    } else {
        match lt::create_handle() {
            Ok(h) => return Some(Handle(h)),
            Err(e) => format!("creating a cuBLASLt handle failed ({e:?})"),
        }
    };
    eprintln!("gemm epilogues: off ({why}); each GEMM's bias kernel runs after it");
    None
}

/// The largest power of two up to 256 dividing `offset` (the allocation's base is aligned to
/// more): what cuBLASLt may assume of a pointer's alignment.
fn alignment(offset: usize) -> u32 {
    if offset == 0 {
        256
    } else {
        (1u32 << offset.trailing_zeros().min(8)).min(256)
    }
}

fn data_type(t: DType) -> Option<sys::cudaDataType> {
    match t {
        DType::F32 => Some(sys::cudaDataType::CUDA_R_32F),
        DType::BF16 => Some(sys::cudaDataType::CUDA_R_16BF),
        _ => None,
    }
}

/// Sets descriptor attribute `attr` to `value`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's type.
unsafe fn set<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), String> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        value as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .map_err(|e| format!("{attr:?}: {e:?}"))
}

/// Sets preference attribute `attr` to `value`.
///
/// # Safety
/// `pref` is live and `T` is the attribute's type.
unsafe fn prefer<T>(
    pref: sys::cublasLtMatmulPreference_t,
    attr: sys::cublasLtMatmulPreferenceAttributes_t,
    value: &T,
) -> Result<(), String> {
    lt::set_matmul_pref_attribute(
        pref,
        attr,
        value as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .map_err(|e| format!("{attr:?}: {e:?}"))
}

/// GEMM `g`'s cuBLASLt call with its bias epilogue, or why cuBLASLt has none.
pub(super) fn plan(h: &Handle, g: &Gemm, e: &Epilogue) -> Result<LtGemm, String> {
    use sys::cublasComputeType_t as C;
    use sys::cublasLtMatmulDescAttributes_t as A;
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let (ty, compute) = match g.compute {
        Compute::F32 => (DType::F32, C::CUBLAS_COMPUTE_32F),
        Compute::Tf32 => (DType::F32, C::CUBLAS_COMPUTE_32F_FAST_TF32),
        Compute::Bf16F32 => (DType::BF16, C::CUBLAS_COMPUTE_32F),
        other => return Err(format!("no epilogue for {other:?} GEMMs")),
    };
    let (dt, bias_dt) = (data_type(ty), data_type(e.bias_dtype));
    let (Some(dt), Some(bias_dt)) = (dt, bias_dt) else {
        return Err(format!("a {} bias on a {ty} GEMM", e.bias_dtype));
    };
    let desc = lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F)
        .map_err(|err| format!("a matmul descriptor: {err:?}"))?;
    // Stored shapes: the first operand m×k (k×m transposed), the second k×n (n×k), the
    // result m×n.
    let (fr, fc) = if g.trans_first {
        (g.k, g.m)
    } else {
        (g.m, g.k)
    };
    let (sr, sc) = if g.trans_second {
        (g.n, g.k)
    } else {
        (g.k, g.n)
    };
    let shapes = [
        (fr, fc, g.ld_first),
        (sr, sc, g.ld_second),
        (g.m, g.n, g.ld_out),
    ];
    let mut layouts = [std::ptr::null_mut(); 3];
    for (l, (r, c, ld)) in layouts.iter_mut().zip(shapes) {
        match lt::create_matrix_layout(dt, r as u64, c as u64, ld as i64) {
            Ok(made) => *l = made,
            Err(err) => {
                // SAFETY: the ones made so far, destroyed once.
                unsafe {
                    layouts.iter().filter(|l| !l.is_null()).for_each(|&l| {
                        let _ = lt::destroy_matrix_layout(l);
                    });
                    let _ = lt::destroy_matmul_desc(desc);
                }
                return Err(format!("a matrix layout: {err:?}"));
            }
        }
    }
    // From here `call` owns the descriptors (its Drop frees them on an error).
    let mut call = LtGemm {
        desc,
        layouts,
        algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        workspace: 0,
    };
    // The bias pointer is set at each enqueue (it is an address, and the descriptor is the
    // step's); its type and the epilogue here.
    let (ta, tb) = (g.trans_first as i32, g.trans_second as i32);
    let bias_type = bias_dt as i32;
    // SAFETY: `desc` is live; each value has its attribute's type (int32 for the transposes
    // and the data type, the epilogue enum's uint32).
    unsafe {
        set(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &ta)?;
        set(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &tb)?;
        let epi = sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
        set(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
        set(desc, A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type)?;
    }
    let pref = lt::create_matmul_pref().map_err(|err| format!("a preference: {err:?}"))?;
    let found = (|| {
        // Less a bias rounded into the workspace's tail.
        let bytes = g.library_workspace() as u64;
        let aligned = |o: usize| alignment(o);
        // SAFETY: `pref` is live; the workspace limit is a uint64, alignments and the
        // reduction mask uint32.
        unsafe {
            prefer(pref, P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes)?;
            prefer(
                pref,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                &aligned(g.first),
            )?;
            prefer(
                pref,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                &aligned(g.second),
            )?;
            prefer(
                pref,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                &aligned(g.out),
            )?;
            prefer(
                pref,
                P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                &aligned(g.out),
            )?;
            if ty == DType::BF16 {
                // Split-K's partial sums in f32 only, as cuBLAS's math mode keeps them
                // (`CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`).
                let mask =
                    sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
                prefer(pref, P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask)?;
            }
            let [a, b, d] = layouts;
            lt::get_matmul_algo_heuristic(h.0, desc, a, b, d, d, pref)
                .map_err(|err| format!("no algorithm ({err:?})"))
        }
    })();
    // SAFETY: made above, destroyed once.
    unsafe {
        let _ = lt::destroy_matmul_pref(pref);
    }
    let found = found?;
    if found.workspaceSize > g.library_workspace() {
        return Err(format!(
            "its algorithm asks {} bytes of workspace, the plan gives {}",
            found.workspaceSize,
            g.library_workspace()
        ));
    }
    call.algo = found.algo;
    call.workspace = found.workspaceSize;
    Ok(call)
}

/// The cuBLASLt calls of every GEMM with an epilogue in `program`, by node; those cuBLASLt
/// refuses are left out (their fallbacks run) and each refusal printed once.
pub(super) fn plans(h: Option<&Handle>, program: &Program) -> HashMap<NodeId, LtGemm> {
    let mut out = HashMap::new();
    let Some(h) = h else {
        return out;
    };
    let (mut fused, mut refused) = (0, 0);
    for op in program.all_ops() {
        let DeviceOp::Gemm(g) = op else { continue };
        let Some(e) = &g.epilogue else { continue };
        match plan(h, g, e) {
            Ok(call) => {
                out.insert(g.node, call);
                fused += 1;
            }
            Err(why) => {
                refused += 1;
                eprintln!(
                    "gemm epilogue of matmul node %{} ({}x{}x{}, {:?}, {} bias): {why}; its \
                     bias kernel runs after it",
                    g.node.index(),
                    g.m,
                    g.n,
                    g.k,
                    g.compute,
                    e.bias_dtype
                );
            }
        }
    }
    eprintln!("gemm epilogues: {fused} through cuBLASLt, {refused} refused");
    out
}

/// Enqueues `call` (GEMM `g`'s) on `stream` over the allocation at `base`.
///
/// # Safety
/// `call` was planned for `g` with `h`; every offset of `g` lies inside the allocation at
/// `base` (the program's check); the workspace is the planned one, free while this runs.
pub(super) unsafe fn enqueue(
    h: &Handle,
    call: &LtGemm,
    g: &Gemm,
    base: u64,
    stream: cudarc::driver::sys::CUstream,
) -> Result<(), String> {
    let Some(e) = &g.epilogue else {
        return Err("a GEMM without an epilogue".into());
    };
    let at = |o: usize| (base + o as u64) as *mut c_void;
    let bias = base + e.bias as u64;
    set(
        call.desc,
        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        &bias,
    )?;
    let (one, zero) = (1f32, 0f32);
    let [a, b, d] = call.layouts;
    lt::matmul(
        h.0,
        call.desc,
        &one as *const f32 as *const c_void,
        &zero as *const f32 as *const c_void,
        at(g.first),
        a,
        at(g.second),
        b,
        at(g.out),
        d,
        at(g.out),
        d,
        &call.algo,
        at(g.workspace.offset),
        call.workspace,
        stream as sys::cudaStream_t,
    )
    .map_err(|err| format!("cublasLtMatmul: {err:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_turns_epilogues_on_only_at_one() {
        assert!(!enabled(None));
        assert!(enabled(Some("1".as_ref())));
        assert!(!enabled(Some("0".as_ref())));
        assert!(!enabled(Some("yes".as_ref())));
    }

    #[test]
    fn a_pointers_alignment_is_its_offsets_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0), 256);
        assert_eq!(alignment(512), 256);
        assert_eq!(alignment(256 + 16), 16);
        assert_eq!(alignment(6), 2);
    }
}
