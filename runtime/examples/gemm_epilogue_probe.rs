//! What cuBLASLt accepts of the GEMM epilogues a bf16 transformer step could use (issue 52):
//! for each of gpt2's shapes (batch 8, seq 1024, d_model 768; cuBLAS's column-major m, n, k),
//! each epilogue (BIAS, GELU_BIAS, GELU_AUX_BIAS, BGRADA, BGRADB) and each bias dtype (unset,
//! bf16, f32), with bf16 operands and result, f32 compute and scale and 32 MiB of workspace,
//! whether `cublasLtMatmulAlgoGetHeuristic` offers an algorithm, for each pair of transposes.
//! Then one small bf16 GEMM with a bf16 bias through `CUBLASLT_EPILOGUE_BIAS`, run and
//! compared with the host: how many of its values are `bf16(acc + bias)` (one rounding) and
//! how many `bf16(bf16(acc) + bias)` (the product rounded first, as a GEMM then a bias
//! kernel computes it), on products exact in f32.
//!
//!     gemm_epilogue_probe
//!
//! Needs a GPU and cuBLASLt; without them it says so and exits 0.

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaContext, DevicePtr};
use half::bf16;
use std::ffi::c_void;

use sys::cublasLtEpilogue_t as E;
use sys::cublasLtMatmulDescAttributes_t as A;
use sys::cudaDataType::{CUDA_R_16BF, CUDA_R_32F};

const WORKSPACE: usize = 32 << 20;

/// A made-up, 256-byte-aligned device address: the heuristic reads no data.
const SOMEWHERE: u64 = 1 << 20;

/// Sets descriptor attribute `attr` to `v`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's type.
unsafe fn set<T>(desc: sys::cublasLtMatmulDesc_t, attr: A, v: &T) -> Result<(), String> {
    lt::set_matmul_desc_attribute(
        desc,
        attr,
        v as *const T as *const c_void,
        std::mem::size_of::<T>(),
    )
    .map_err(|e| format!("{attr:?}: {e:?}"))
}

/// A bf16 GEMM's descriptor and layouts: `D [m, n] = op(A) op(B) (+ the epilogue)`.
struct Call {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
}

impl Drop for Call {
    fn drop(&mut self) {
        // SAFETY: made by `call`, destroyed once.
        unsafe {
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn call(
    (m, n, k): (usize, usize, usize),
    (ta, tb): (bool, bool),
    epi: E,
    bias: Option<sys::cudaDataType>,
) -> Result<Call, String> {
    let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, CUDA_R_32F)
        .map_err(|e| format!("{e:?}"))?;
    let mut c = Call {
        desc,
        layouts: [std::ptr::null_mut(); 3],
    };
    let (ar, ac) = if ta { (k, m) } else { (m, k) };
    let (br, bc) = if tb { (n, k) } else { (k, n) };
    for (l, (r, cols)) in c.layouts.iter_mut().zip([(ar, ac), (br, bc), (m, n)]) {
        *l = lt::create_matrix_layout(CUDA_R_16BF, r as u64, cols as u64, r as i64)
            .map_err(|e| format!("{e:?}"))?;
    }
    // SAFETY: `desc` is live; int32 transposes and data types, the epilogue's uint32, the
    // pointers' uint64 and the aux leading dimension's int64.
    unsafe {
        set(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &(ta as i32))?;
        set(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &(tb as i32))?;
        set(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epi)?;
        set(desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &SOMEWHERE)?;
        if let Some(t) = bias {
            set(desc, A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &(t as i32))?;
        }
        if epi == E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS {
            set(
                desc,
                A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                &SOMEWHERE,
            )?;
            set(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &(m as i64))?;
            set(
                desc,
                A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                &(CUDA_R_16BF as i32),
            )?;
        }
    }
    Ok(c)
}

/// The algorithm cuBLASLt's heuristic offers for `c` within the workspace, or why none.
fn heuristic(
    h: sys::cublasLtHandle_t,
    c: &Call,
) -> Result<sys::cublasLtMatmulHeuristicResult_t, String> {
    let pref = lt::create_matmul_pref().map_err(|e| format!("{e:?}"))?;
    let bytes = WORKSPACE as u64;
    // SAFETY: `pref` and the call's descriptors are live; the workspace limit is a uint64.
    let found = unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &bytes as *const u64 as *const c_void,
            8,
        )
        .map_err(|e| format!("{e:?}"))
        .and_then(|_| {
            let [a, b, d] = c.layouts;
            lt::get_matmul_algo_heuristic(h, c.desc, a, b, d, d, pref)
                .map_err(|e| format!("{:?}", e.0))
        })
    };
    // SAFETY: made above, destroyed once.
    unsafe {
        let _ = lt::destroy_matmul_pref(pref);
    }
    found
}

fn main() {
    // SAFETY: only tries to open the library.
    if !unsafe { sys::is_culib_present() } {
        println!("skipping: libcublasLt was not found");
        return;
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            println!("skipping: no GPU ({e:?})");
            return;
        }
    };
    let h = lt::create_handle().expect("a cuBLASLt handle");
    let shapes = [
        ("qkv forward", 2304, 8192, 768),
        ("fc forward", 3072, 8192, 768),
        ("qkv weight gradient, bias along m", 2304, 768, 8192),
        ("qkv weight gradient, bias along n", 768, 2304, 8192),
    ];
    let epilogues = [
        E::CUBLASLT_EPILOGUE_BIAS,
        E::CUBLASLT_EPILOGUE_GELU_BIAS,
        E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
        E::CUBLASLT_EPILOGUE_BGRADA,
        E::CUBLASLT_EPILOGUE_BGRADB,
    ];
    let biases = [
        ("unset", None),
        ("bf16", Some(CUDA_R_16BF)),
        ("f32", Some(CUDA_R_32F)),
    ];
    for (what, m, n, k) in shapes {
        for epi in epilogues {
            for (bname, bias) in biases {
                let mut line = Vec::new();
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    let t = |x: bool| if x { 'T' } else { 'N' };
                    let got = call((m, n, k), (ta, tb), epi, bias).and_then(|c| heuristic(h, &c));
                    line.push(match got {
                        Ok(r) => format!("{}{}: ok ({} B)", t(ta), t(tb), r.workspaceSize),
                        Err(e) => format!("{}{}: {e}", t(ta), t(tb)),
                    });
                }
                println!(
                    "probe {what} {m}x{n}x{k} {epi:?} bias {bname}: {}",
                    line.join("; ")
                );
            }
        }
    }
    if let Err(e) = run_bias(&ctx, h) {
        println!("run: failed: {e}");
    }
    // SAFETY: made above, destroyed once.
    unsafe {
        let _ = lt::destroy_handle(h);
    }
}

/// Runs a small bf16 GEMM with a bf16 bias epilogue and compares it with the host.
fn run_bias(ctx: &std::sync::Arc<CudaContext>, h: sys::cublasLtHandle_t) -> Result<(), String> {
    let (m, n, k) = (64usize, 40usize, 48usize);
    let mut seed = 12345u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as u32
    };
    // Multiples of 1/8 in [-2, 2): products and their sums over k are exact in f32.
    let mut eighths = |len: usize| -> Vec<bf16> {
        (0..len)
            .map(|_| bf16::from_f32((next() % 32) as f32 / 8.0 - 2.0))
            .collect()
    };
    let (a, b) = (eighths(m * k), eighths(k * n));
    let mut next2 = {
        let mut s = 99u64;
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
            (s >> 40) as f32 / (1u64 << 24) as f32
        }
    };
    // An f32 bias rounded to bf16 as the rounding kernel does.
    let bias: Vec<bf16> = (0..m)
        .map(|_| bf16::from_f32(next2() * 6.0 - 3.0))
        .collect();
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
    let stream = ctx.default_stream();
    let e = |e: cudarc::driver::DriverError| format!("{e:?}");
    let da = stream.clone_htod(&bits(&a)).map_err(e)?;
    let db = stream.clone_htod(&bits(&b)).map_err(e)?;
    let dbias = stream.clone_htod(&bits(&bias)).map_err(e)?;
    let dd = stream.alloc_zeros::<u16>(m * n).map_err(e)?;
    let ws = stream.alloc_zeros::<u8>(WORKSPACE).map_err(e)?;
    let c = call(
        (m, n, k),
        (false, false),
        E::CUBLASLT_EPILOGUE_BIAS,
        Some(CUDA_R_16BF),
    )?;
    let found = heuristic(h, &c)?;
    {
        let (pa, _ga) = da.device_ptr(&stream);
        let (pb, _gb) = db.device_ptr(&stream);
        let (pbias, _gbias) = dbias.device_ptr(&stream);
        let (pd, _gd) = dd.device_ptr(&stream);
        let (pw, _gw) = ws.device_ptr(&stream);
        let (one, zero) = (1f32, 0f32);
        let [la, lb, ld] = c.layouts;
        // SAFETY: live descriptors and buffers of the layouts' sizes; the bias pointer's
        // uint64; the workspace as large as the heuristic's limit.
        unsafe {
            set(c.desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pbias)?;
            lt::matmul(
                h,
                c.desc,
                &one as *const f32 as *const c_void,
                &zero as *const f32 as *const c_void,
                pa as *const c_void,
                la,
                pb as *const c_void,
                lb,
                pd as *const c_void,
                ld,
                pd as *mut c_void,
                ld,
                &found.algo,
                pw as *mut c_void,
                found.workspaceSize,
                stream.cu_stream() as sys::cudaStream_t,
            )
            .map_err(|e| format!("cublasLtMatmul: {e:?}"))?;
        }
    }
    stream.synchronize().map_err(e)?;
    let got = stream.clone_dtoh(&dd).map_err(e)?;
    let (mut once, mut twice, mut differ, mut other) = (0, 0, 0, 0);
    for j in 0..n {
        for i in 0..m {
            let acc: f32 = (0..k)
                .map(|p| a[i + p * m].to_f32() * b[p + j * k].to_f32())
                .sum();
            let bias = bias[i].to_f32();
            let one = bf16::from_f32(acc + bias).to_bits();
            let two = bf16::from_f32(bf16::from_f32(acc).to_f32() + bias).to_bits();
            let g = got[i + j * m];
            differ += usize::from(one != two);
            match (g == one, g == two) {
                (true, true) => {}
                (true, false) => once += 1,
                (false, true) => twice += 1,
                (false, false) => other += 1,
            }
        }
    }
    println!(
        "run {m}x{n}x{k} bf16, bf16 bias, BIAS epilogue: {} values; {differ} where one and two \
         roundings differ: {once} the one rounding, {twice} the two; {other} neither",
        m * n
    );
    Ok(())
}
