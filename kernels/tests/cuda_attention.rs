//! The fused-attention kernels' code generation, checked on the host: deterministic text named
//! by its hash, every size and the scale as literals, the parameter lists of the API, refusals
//! for shapes the kernels do not take, shared memory within 48 KiB for every supported head dim
//! and precision (the tiling's count and the kernels' own declarations), and the tensor-core
//! instructions of each precision. (The kernels' arithmetic is checked on the host by
//! cuda_attention_emu.rs and on the GPU by runtime/tests/cuda_attention.rs.)

use ingot_kernels::attention::{Layout, Strides};
use ingot_kernels::cuda::attention::{
    self, AttentionError, AttentionPrecision, AttentionShape, DqKernel, TileKernel, Tiles,
    SHARED_LIMIT,
};
use ingot_kernels::cuda::CudaKernel;

const PRECISIONS: [AttentionPrecision; 3] = [
    AttentionPrecision::F32,
    AttentionPrecision::Tf32,
    AttentionPrecision::Bf16,
];

fn shape(p: AttentionPrecision, tq: usize, tk: usize, d: usize, causal: bool) -> AttentionShape {
    AttentionShape {
        batch_heads: 96,
        seq_q: tq,
        seq_k: tk,
        head_dim: d,
        causal,
        scale: 0.125,
        precision: p,
        layout: Layout::contiguous(tq, tk, d),
    }
}

/// [`shape`] (96 problems) in `layout`.
fn laid_out(
    p: AttentionPrecision,
    (tq, tk, d): (usize, usize, usize),
    causal: bool,
    layout: Layout,
) -> AttentionShape {
    AttentionShape {
        layout,
        ..shape(p, tq, tk, d, causal)
    }
}

/// The token and packed layouts of 96 problems (batch 8 × 12 heads), Tq = Tk = `t`.
fn strided(p: AttentionPrecision, t: usize, d: usize, causal: bool) -> [AttentionShape; 2] {
    [
        laid_out(p, (t, t, d), causal, Layout::tokens(12, t, t, d)),
        laid_out(p, (t, t, d), causal, Layout::packed(12, t, d)),
    ]
}

fn all(s: &AttentionShape) -> Vec<CudaKernel> {
    let b = attention::backward(s).unwrap();
    vec![attention::forward(s).unwrap(), b.preprocess, b.dkdv, b.dq]
}

/// The 64-bit FNV-1a of the text with the name put back to the placeholder.
fn fnv(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in text.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[test]
fn every_kernel_is_deterministic_and_named_by_the_hash_of_its_text() {
    for p in PRECISIONS {
        let s = shape(p, 1000, 1000, 64, true);
        let (a, b) = (all(&s), all(&s));
        assert_eq!(a, b, "{p:?}: two generations differ");
        for k in &a {
            let text = k.source.replace(&k.name, "@KERNEL@");
            assert_eq!(k.name, format!("ingot_{:016x}", fnv(&text)), "{p:?}");
            assert_eq!(k.source.matches(&k.name).count(), 1, "{p:?}: the name once");
            assert_eq!(k.launch.shared_bytes, 0, "static shared memory only");
        }
        let names: std::collections::BTreeSet<_> = a.iter().map(|k| &k.name).collect();
        assert_eq!(names.len(), 4, "{p:?}: four distinct kernels");
    }
}

#[test]
fn sizes_scale_and_mask_are_literals_that_change_the_name() {
    let base = shape(AttentionPrecision::Bf16, 1000, 777, 80, false);
    let f = attention::forward(&base).unwrap();
    for lit in [
        "BH = 96",
        "TQ = 1000",
        "TK = 777",
        "D = 80",
        "SCALE = 0.125f",
    ] {
        assert!(f.source.contains(lit), "forward lacks {lit}");
    }
    let variants = [
        AttentionShape {
            causal: true,
            ..base
        },
        AttentionShape {
            scale: 0.25,
            ..base
        },
        AttentionShape { seq_k: 778, ..base },
        AttentionShape {
            batch_heads: 95,
            ..base
        },
        AttentionShape {
            precision: AttentionPrecision::Tf32,
            ..base
        },
    ];
    for v in variants {
        let g = attention::forward(&v).unwrap();
        assert_ne!(g.name, f.name, "{v:?} has the name of {base:?}");
    }
}

/// The parameters of a kernel's entry point, as `type name` strings.
fn params(k: &CudaKernel) -> Vec<String> {
    let at = k.source.find(&format!("{}(", k.name)).unwrap() + k.name.len() + 1;
    let end = at + k.source[at..].find(')').unwrap();
    k.source[at..end].split(", ").map(str::to_string).collect()
}

#[test]
fn the_parameter_lists_are_the_apis() {
    for (p, t) in [
        (AttentionPrecision::F32, "float"),
        (AttentionPrecision::Tf32, "float"),
        (AttentionPrecision::Bf16, "unsigned short"),
    ] {
        let s = shape(p, 100, 100, 64, true);
        let k = all(&s);
        let c = |n: &str| format!("const {t}* {n}");
        let m = |n: &str| format!("{t}* {n}");
        assert_eq!(
            params(&k[0]),
            [c("q"), c("k"), c("v"), m("out"), "float* lse".into()]
        );
        assert_eq!(params(&k[1]), [c("out"), c("dout"), "float* delta".into()]);
        let lse = "const float* lse".to_string();
        let delta = "const float* delta".to_string();
        assert_eq!(
            params(&k[2]),
            [
                c("q"),
                c("k"),
                c("v"),
                c("dout"),
                lse.clone(),
                delta.clone(),
                m("dk"),
                m("dv")
            ]
        );
        assert_eq!(
            params(&k[3]),
            [c("q"), c("k"), c("v"), c("dout"), lse, delta, m("dq")]
        );
        for k in &k {
            assert!(k.source.contains("extern \"C\" __global__"));
            assert!(!k.source.contains("cuda_bf16.h") && !k.source.contains("__nv_bfloat16"));
        }
    }
}

#[test]
fn each_precision_uses_its_arithmetic() {
    let kinds = [
        (AttentionPrecision::F32, "ig_fa_mm_nk_f32<", "fmaf"),
        (
            AttentionPrecision::Tf32,
            "ig_fa_mm_nk_tf32<",
            "cvt.rna.tf32.f32",
        ),
        (
            AttentionPrecision::Bf16,
            "ig_fa_mm_nk_bf16<",
            "ig_bf16_bits(",
        ),
    ];
    for (p, call, other) in kinds {
        for k in all(&shape(p, 257, 257, 96, false))
            .iter()
            .filter(|k| k.source.contains("__shared__"))
        {
            let body = &k.source[k.source.find("extern \"C\"").unwrap()..];
            assert!(body.contains(call), "{p:?}: {} calls no {call}", k.name);
            assert!(k.source.contains(other), "{p:?}: {} lacks {other}", k.name);
            for (q, c, _) in kinds {
                if q != p {
                    assert!(!body.contains(c), "{p:?}: {} calls {c}", k.name);
                }
            }
        }
    }
    let bf = attention::forward(&shape(AttentionPrecision::Bf16, 64, 64, 64, true)).unwrap();
    assert!(bf
        .source
        .contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    assert!(bf
        .source
        .contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"));
}

/// Bytes of the `__shared__` arrays a kernel declares.
fn declared_shared(k: &CudaKernel) -> usize {
    k.source
        .lines()
        .filter(|l| l.contains("__shared__"))
        .map(|l| {
            let size = if l.contains("unsigned short") { 2 } else { 4 };
            let n: usize = l[l.find('[').unwrap() + 1..l.find(']').unwrap()]
                .parse()
                .unwrap();
            size * n
        })
        .sum()
}

/// Calls `f` with each precision, supported head dim, all four kernels of a 300x300 causal
/// problem, and each tiled one (forward, dkdv, dq) with its kind and tiling.
fn each_tiled(
    mut f: impl FnMut(AttentionPrecision, usize, &[CudaKernel], &CudaKernel, TileKernel, &Tiles),
) {
    for p in PRECISIONS {
        for d in (32..=128).step_by(16) {
            let s = shape(p, 300, 300, d, true);
            let k = all(&s);
            for (i, which) in [
                (0, TileKernel::Forward),
                (2, TileKernel::Dkdv),
                (3, TileKernel::Dq),
            ] {
                let t = attention::tiling(&s, which).unwrap();
                f(p, d, &k, &k[i], which, &t);
            }
        }
    }
}

#[test]
fn shared_memory_stays_within_48_kib_for_every_supported_head_dim_and_precision() {
    each_tiled(|p, d, k, kernel, which, t| {
        let declared = declared_shared(kernel);
        assert_eq!(declared, t.shared_bytes, "{p:?} d={d} {which:?}");
        assert!(
            declared <= SHARED_LIMIT,
            "{p:?} d={d} {which:?}: {declared} bytes"
        );
        assert_eq!(kernel.launch.block, [32 * t.warps as u32, 1, 1]);
        assert_eq!(t.rows, 16 * t.warps);
        assert_eq!(t.inner % 16, 0);
        assert_eq!(declared_shared(&k[1]), 0, "preprocess");
    });
    // GPT-2's shape gets the tilings measured fastest (four warps everywhere).
    let gpt2 = shape(AttentionPrecision::Bf16, 1024, 1024, 64, true);
    for (which, inner) in [
        (TileKernel::Forward, 64),
        (TileKernel::Dkdv, 32),
        (TileKernel::Dq, 64),
    ] {
        let t = attention::tiling(&gpt2, which).unwrap();
        assert_eq!((t.rows, t.inner), (64, inner), "{which:?}");
    }
}

#[test]
fn grids_cover_every_tile_of_every_head() {
    for p in PRECISIONS {
        for (tq, tk) in [(1, 1), (17, 100), (257, 64), (1024, 1024)] {
            let s = shape(p, tq, tk, 64, false);
            let k = all(&s);
            let f = attention::tiling(&s, TileKernel::Forward).unwrap();
            let kv = attention::tiling(&s, TileKernel::Dkdv).unwrap();
            let q = attention::tiling(&s, TileKernel::Dq).unwrap();
            assert_eq!(k[0].launch.grid, [(96 * tq.div_ceil(f.rows)) as u32, 1, 1]);
            assert_eq!(k[1].launch.grid[0] as usize * 8, (96 * tq).div_ceil(8) * 8);
            assert_eq!(k[2].launch.grid, [(96 * tk.div_ceil(kv.rows)) as u32, 1, 1]);
            assert_eq!(k[3].launch.grid, [(96 * tq.div_ceil(q.rows)) as u32, 1, 1]);
        }
    }
}

#[test]
fn unsupported_shapes_are_refused_with_what_is_wrong() {
    let ok = shape(AttentionPrecision::Bf16, 10, 10, 64, false);
    for d in [0, 8, 16, 24, 40, 72, 144, 256] {
        let s = AttentionShape { head_dim: d, ..ok };
        let e = attention::forward(&s).unwrap_err();
        assert_eq!(e, AttentionError::UnsupportedHeadDim { head_dim: d });
        assert!(e.to_string().contains(&format!("head_dim {d}")), "{e}");
        assert_eq!(attention::backward(&s).unwrap_err(), e);
    }
    for (s, what) in [
        (
            AttentionShape {
                batch_heads: 0,
                ..ok
            },
            "batch_heads",
        ),
        (AttentionShape { seq_q: 0, ..ok }, "seq_q"),
        (AttentionShape { seq_k: 0, ..ok }, "seq_k"),
    ] {
        assert_eq!(
            attention::forward(&s).unwrap_err(),
            AttentionError::Empty { what }
        );
        assert!(attention::backward(&s)
            .unwrap_err()
            .to_string()
            .contains(what));
    }
    let nan = AttentionShape {
        scale: f32::NAN,
        ..ok
    };
    let e = attention::forward(&nan).unwrap_err();
    assert!(matches!(e, AttentionError::NonFiniteScale { .. }));
    assert!(e.to_string().contains("NaN"), "{e}");
    let long = AttentionShape {
        seq_q: 1 << 31,
        ..ok
    };
    assert!(matches!(
        attention::forward(&long).unwrap_err(),
        AttentionError::TooLarge { what: "seq_q", .. }
    ));
}

#[test]
fn the_backward_workspace_is_delta() {
    let s = shape(AttentionPrecision::Tf32, 123, 45, 64, true);
    assert_eq!(attention::backward_workspace_bytes(&s), 96 * 123 * 4);
    // The default recomputes ds in every precision: bf16's workspace is delta too.
    assert_eq!(attention::DEFAULT_DQ, DqKernel::Recompute);
    let bf16 = shape(AttentionPrecision::Bf16, 123, 45, 64, true);
    assert_eq!(attention::backward_workspace_bytes(&bf16), 96 * 123 * 4);
    assert_eq!(attention::backward_ds_bytes(&bf16), 0);
    assert_eq!(
        attention::backward_workspace_bytes_with(&s, DqKernel::StoredDs),
        96 * 123 * 4,
        "only bf16 stores ds"
    );
}

/// bf16's workspace with the stored ds: delta, then from the next multiple of 256 bytes the
/// stored ds, each query row holding its keys rounded up to whole 64-key blocks (causal: the
/// blocks up to its own), counted here row by row.
#[test]
fn the_stored_ds_workspace_is_delta_then_the_rows_of_ds_it_can_see() {
    let how = DqKernel::StoredDs;
    for (tq, tk, causal) in [
        (123, 45, true),
        (123, 45, false),
        (45, 300, true),
        (1024, 1024, true),
    ] {
        let s = shape(AttentionPrecision::Bf16, tq, tk, 64, causal);
        let full = tk.div_ceil(64) * 64;
        let keys: usize = (0..tq)
            .map(|i| {
                if causal {
                    full.min((i / 64 + 1) * 64)
                } else {
                    full
                }
            })
            .sum();
        let at = (96 * tq * 4).div_ceil(256) * 256;
        assert_eq!(attention::backward_ds_offset(&s), at);
        assert_eq!(attention::backward_ds_bytes_with(&s, how), 96 * keys * 2);
        assert_eq!(
            attention::backward_workspace_bytes_with(&s, how),
            at + 96 * keys * 2
        );
    }
    // GPT-2's: 96 problems of 136 blocks of 64 × 64 (of 256): 107 MB, not the square's 201.
    let gpt2 = shape(AttentionPrecision::Bf16, 1024, 1024, 64, true);
    assert_eq!(attention::backward_ds_bytes_with(&gpt2, how), 106_954_752);
}

/// With the stored ds, bf16's dq multiplies it (no exponential) and dkdv writes it; by default
/// and in f32 and tf32 dq recomputes it and dkdv's text is the recomputing one's.
#[test]
fn the_stored_ds_dq_reads_ds_and_the_default_recomputes_it() {
    let body = |k: &CudaKernel| k.source[k.source.find("extern \"C\"").unwrap()..].to_string();
    for p in PRECISIONS {
        let s = shape(p, 300, 300, 64, true);
        let stored = attention::backward_with(&s, DqKernel::StoredDs).unwrap();
        let default = attention::backward(&s).unwrap();
        let bf16 = p == AttentionPrecision::Bf16;
        assert_eq!(
            body(&stored.dq).contains("ig_fa_ds_load_async<"),
            bf16,
            "{p:?}"
        );
        assert_eq!(body(&stored.dq).contains("exp2f("), !bf16, "{p:?}");
        assert_eq!(
            body(&stored.dkdv).contains("ig_fa_ds_off<"),
            bf16,
            "{p:?} dkdv"
        );
        assert_eq!(stored.dkdv == default.dkdv, !bf16, "{p:?}");
        for k in [&default.preprocess, &default.dkdv, &default.dq] {
            assert!(!k.source.contains("INGOT_FA_DS"), "{p:?}: {}", k.name);
        }
        assert_eq!(
            attention::backward_with(&s, DqKernel::Recompute).unwrap(),
            default
        );
    }
    // The stored-ds dq: four warps of 64 query rows, 64 keys a step for GPT-2's head dim.
    let s = shape(AttentionPrecision::Bf16, 1024, 1024, 64, true);
    let k = attention::backward_with(&s, DqKernel::StoredDs).unwrap().dq;
    assert_eq!(k.launch.block, [128, 1, 1]);
    assert_eq!(k.launch.grid, [96 * 16, 1, 1]);
    assert!(declared_shared(&k) <= SHARED_LIMIT);
}

/// Compiles `kernels` by the host's C++ compiler as far as the host goes: the device built-ins
/// declared, the text must parse and type-check (templates instantiated). Skips, saying so,
/// without a compiler; `tag` names the file (tests run in parallel).
fn assert_compiles_on_host(kernels: &[CudaKernel], tag: &str) {
    let Some(cxx) = ingot_testkit::cxx::host_cxx_or_skip() else {
        return;
    };
    let shim = r#"#include <math.h>
#define __align__(n) __attribute__((aligned(n)))
#define asm(...) ((void)0)
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct float2 { float x, y; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
struct Dim3 { unsigned x, y, z; };
static Dim3 threadIdx, blockIdx;
static float __shfl_xor_sync(unsigned, float v, int) { return v; }
static void __syncthreads() {}
static void __syncwarp() {}
"#;
    let mut src = format!(
        "{}{shim}{}",
        ingot_testkit::cxx::CUDA_ON_HOST,
        ingot_kernels::cuda::PRELUDE_BF16
    );
    // Each kernel once (the preprocess kernel of f32 and tf32 is one), as a module holds it.
    let mut names = std::collections::BTreeSet::new();
    for k in kernels {
        if names.insert(k.name.clone()) {
            src.push_str(&k.source);
        }
    }
    let flags = [
        "-std=c++17",
        "-fsyntax-only",
        "-Wall",
        "-Wno-unused-variable",
        "-Wno-unused-but-set-variable",
        "-Wno-unknown-pragmas",
    ];
    let dir = format!("ingot_fa_cpp_{tag}");
    if let Err(e) = ingot_testkit::cxx::compile(cxx, &dir, "attention.cpp", &src, &flags) {
        panic!("{} kernels do not compile on the host: {e}", names.len());
    }
}

#[test]
fn the_generated_text_compiles_as_cpp_on_the_host() {
    let mut kernels = Vec::new();
    for p in PRECISIONS {
        for (d, causal) in [(32, true), (80, false), (128, true)] {
            kernels.extend(all(&shape(p, 100, 77, d, causal)));
        }
    }
    assert_compiles_on_host(&kernels, "contiguous");
}

#[test]
fn the_token_and_packed_layouts_generate_text_that_compiles_as_cpp_on_the_host() {
    let mut kernels = Vec::new();
    for p in PRECISIONS {
        for (d, causal) in [(64, true), (96, false)] {
            for s in strided(p, 100, d, causal) {
                kernels.extend(all(&s));
            }
        }
    }
    assert_compiles_on_host(&kernels, "strided");
}

/// The lines of `k`'s text that declare the layout's constants.
fn layout_lines(k: &CudaKernel) -> Vec<&str> {
    k.source
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("constexpr unsigned long long") && l.contains("_S"))
        .collect()
}

/// The layout constants `k` should declare: for each operand prefix, its strides in the
/// `batch, head, row` pattern.
fn constants(groups: &[(&str, [usize; 3])]) -> Vec<String> {
    groups
        .iter()
        .map(|(p, [b, h, r])| {
            format!(
                "constexpr unsigned long long {p}_SB = {b}ull, {p}_SH = {h}ull, {p}_SR = {r}ull;"
            )
        })
        .collect()
}

#[test]
fn the_layout_strides_are_literals_of_every_kernel_and_change_the_names() {
    let [tokens, packed] = strided(AttentionPrecision::Bf16, 100, 64, true);
    let (tk, pk) = (all(&tokens), all(&packed));
    for k in tk.iter().chain(&pk) {
        assert!(k
            .source
            .contains("constexpr unsigned long long HEADS = 12ull;"));
        assert!(
            k.source.contains("b = bh / HEADS, h = bh % HEADS;"),
            "{}",
            k.name
        );
    }
    // Token-major, 12 heads of 64: a row is a token (12 · 64), a head 64 elements on, a batch
    // 100 tokens.
    let token = [76_800, 64, 768];
    for k in [&tk[0], &tk[2], &tk[3]] {
        let want = constants(&[("Q", token), ("KV", token), ("O", token)]);
        assert_eq!(layout_lines(k), want, "{}", k.name);
    }
    // The preprocess kernel reads out and dout only, by their layout.
    assert_eq!(layout_lines(&tk[1]), constants(&[("O", token)]));
    assert!(tk[1]
        .source
        .contains("at = b * O_SB + h * O_SH + i * O_SR;"));
    assert!(tk[1].source.contains("out[at + d]") && tk[1].source.contains("dout[at + d]"));
    assert!(
        tk[1].source.contains("delta[row] = acc;"),
        "delta stays contiguous"
    );
    // Packed: q/k/v rows are tokens of 3 · 12 · 64; out stays token-major.
    let slot = [230_400, 64, 2304];
    for k in [&pk[0], &pk[2], &pk[3]] {
        let want = constants(&[("Q", slot), ("KV", slot), ("O", token)]);
        assert_eq!(layout_lines(k), want, "{}", k.name);
    }
    // Every global row is loaded and stored by its operand's row stride.
    for (k, strides) in [
        (&pk[0], ["Q_SR", "KV_SR"].as_slice()),
        (&pk[2], &["KV_SR", "Q_SR", "O_SR"]),
        (&pk[3], &["Q_SR", "O_SR", "KV_SR"]),
    ] {
        for st in strides {
            // By ig_fa_load, or (bf16's streamed tiles) ig_fa_load_async.
            let load = format!(", D, {st}, LD, THREADS, TF32>(");
            let copy = format!(", D, {st}, LD, THREADS>(");
            assert!(
                k.source.contains(&load) || k.source.contains(&copy),
                "{} loads no rows by {st}",
                k.name
            );
        }
    }
    assert!(pk[0].source.contains("ob + (unsigned long long)i0 * O_SR"));
    assert!(pk[2]
        .source
        .contains("dkb + (unsigned long long)r0 * KV_SR"));
    assert!(pk[2]
        .source
        .contains("dvb + (unsigned long long)r1 * KV_SR"));
    assert!(pk[3].source.contains("dqb + (unsigned long long)r1 * Q_SR"));
    // The layout is part of the text, so of the name; the preprocess kernel reads only out
    // and dout, token-major in both layouts: one kernel.
    let contiguous = all(&shape(AttentionPrecision::Bf16, 100, 100, 64, true));
    for i in [0, 2, 3] {
        assert_ne!(contiguous[i].name, tk[i].name);
        assert_ne!(tk[i].name, pk[i].name);
    }
    assert_ne!(contiguous[1].name, tk[1].name);
    assert_eq!(tk[1], pk[1]);
}

#[test]
fn layouts_the_kernels_cannot_address_are_refused_with_what_is_wrong() {
    use AttentionPrecision::{Bf16, F32};
    let dims = (10, 10, 64);
    let tokens = |p, heads| laid_out(p, dims, false, Layout::tokens(heads, 10, 10, 64));
    let refused = |s: &AttentionShape| {
        let e = attention::forward(s).unwrap_err();
        assert_eq!(attention::backward(s).unwrap_err(), e, "{s:?}");
        assert_eq!(
            attention::tiling(s, TileKernel::Dq).unwrap_err(),
            e,
            "{s:?}"
        );
        e
    };
    // Heads: none, or not a divisor of the 96 problems.
    for heads in [0, 5, 97] {
        let mut s = tokens(Bf16, 12);
        s.layout.heads = heads;
        let e = refused(&s);
        assert_eq!(
            e,
            AttentionError::Heads {
                heads,
                batch_heads: 96
            }
        );
        assert!(e.to_string().contains(&format!("heads = {heads}")), "{e}");
    }
    assert!(attention::forward(&tokens(Bf16, 96)).is_ok());
    // A row stride below head_dim: rows overlap.
    let mut s = tokens(F32, 12);
    s.layout.kv.row = 32;
    let e = refused(&s);
    assert_eq!(
        e,
        AttentionError::OverlappingRows {
            operand: "kv",
            row: 32,
            head_dim: 64
        }
    );
    assert!(
        e.to_string()
            .contains("kv row stride 32 is less than head_dim 64"),
        "{e}"
    );
    // Strides must be whole 16-byte vectors: 8 bf16 or 4 f32 elements.
    let odd = |p, edit: fn(&mut Layout)| {
        let mut s = tokens(p, 12);
        edit(&mut s.layout);
        s
    };
    let head_68 = |l: &mut Layout| l.out.head = 68;
    let e = refused(&odd(Bf16, head_68));
    assert_eq!(
        e,
        AttentionError::MisalignedStride {
            operand: "out",
            stride: "head",
            value: 68,
            elems: 8
        }
    );
    assert!(e.to_string().contains("out head stride 68"), "{e}");
    assert!(e.to_string().contains("16 bytes"), "{e}");
    assert!(
        attention::forward(&odd(F32, head_68)).is_ok(),
        "68 f32 elements are 17 vectors"
    );
    let row_770 = |l: &mut Layout| l.q.row = 770;
    assert!(matches!(
        refused(&odd(F32, row_770)),
        AttentionError::MisalignedStride {
            operand: "q",
            stride: "row",
            value: 770,
            elems: 4
        }
    ));
    let batch_odd = |l: &mut Layout| l.kv.batch += 1;
    assert!(matches!(
        refused(&odd(F32, batch_odd)),
        AttentionError::MisalignedStride {
            operand: "kv",
            stride: "batch",
            ..
        }
    ));
    // The kernels refuse exactly the layouts `Layout::aligned` calls misaligned.
    for (p, elems) in [(Bf16, 8), (F32, 4)] {
        for pad in [0, 2, 4, 8, 12, 16] {
            let l = Layout {
                heads: 12,
                q: Strides {
                    batch: 10 * 800 + pad,
                    head: 64,
                    row: 800,
                },
                ..Layout::tokens(12, 10, 10, 64)
            };
            let s = laid_out(p, dims, true, l);
            assert_eq!(
                attention::forward(&s).is_ok(),
                l.aligned(elems),
                "{p:?} {pad}"
            );
        }
    }
}

/// The runtime adds the bf16 prelude only to modules whose kernels call its helpers
/// (`cuda::prelude_for`): bf16 kernels call them, f32 and tf32 kernels need none.
#[test]
fn only_bf16_kernels_call_the_bf16_helpers() {
    let helpers = [
        "ig_bf16_bits(",
        "ig_widen(",
        "ig_round(",
        "ig_narrow(",
        "ig_to_bf16(",
    ];
    for p in PRECISIONS {
        for k in all(&shape(p, 100, 100, 64, true)) {
            let calls = helpers.iter().any(|h| k.source.contains(h));
            let needs = p == AttentionPrecision::Bf16;
            assert_eq!(calls, needs, "{p:?} {}", k.name);
            assert_eq!(
                ingot_kernels::cuda::prelude_for([&k]).contains("ig_widen"),
                needs
            );
        }
    }
}

/// bf16's streamed tiles (forward and dq: k and v; dkdv: q and dout, in two copies where they
/// fit) arrive by cp.async a product ahead of their readers; f32 and tf32 load them as before
/// (tf32 rounds each element on its way in).
#[test]
fn bf16_kernels_stream_their_tiles_by_cp_async_and_the_others_do_not() {
    each_tiled(|p, d, _, kernel, which, t| {
        let bf16 = p == AttentionPrecision::Bf16;
        // dkdv streams by cp.async only with its two copies; forward and dq always.
        let streams = bf16 && (which != TileKernel::Dkdv || t.copies == 2);
        assert_eq!(
            kernel.source.contains("ig_fa_load_async<BC")
                || kernel.source.contains("ig_fa_load_async<BR"),
            streams,
            "{p:?} d={d} {which:?}"
        );
        assert_eq!(
            kernel.source.contains("ig_fa_cp_wait<0>();"),
            streams,
            "{p:?} d={d} {which:?}"
        );
        assert!(t.copies == 1 || (bf16 && which == TileKernel::Dkdv));
    });
    // GPT-2's head dim: dkdv holds two copies of its query and dout tiles.
    let s = shape(AttentionPrecision::Bf16, 1024, 1024, 64, true);
    assert_eq!(attention::tiling(&s, TileKernel::Dkdv).unwrap().copies, 2);
}
