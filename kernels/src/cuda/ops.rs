//! CUDA C for the three ops that are not fused kernels: gather, scatter-add and concat (see
//! the IR's `Op::Gather`, `Op::ScatterAdd` and `Op::Concat`). Each is a grid-stride loop over
//! the elements it writes (or, for scatter-add, reads), block 256, grid
//! `min(ceil(elements / 256), 132 * 32)`, with sizes as literals and 32-bit index arithmetic
//! when every extent is below 2^31.

use super::{
    c_type, finish, grid_for, literal, signature, CodegenError, CudaKernel, Ix, Launch, Src, BLOCK,
    MAX_GRID_ELEMENTWISE,
};
use crate::DType;

/// `gather(table [rows, row_len], ids [n]) -> out [n, row_len]`; an id outside `0..rows` gives
/// a zero row. Params: table, ids, out. Ids are i32 or i64.
pub fn gather(
    table: DType,
    ids: DType,
    rows: usize,
    row_len: usize,
    n: usize,
) -> Result<CudaKernel, CodegenError> {
    check_ids("gather", ids)?;
    let total = mul("gather", &[n, row_len])?;
    let table_len = mul("gather", &[rows, row_len])?;
    let ix = Ix::for_extents([total, table_len, n]);
    let params = [
        (format!("const {}*", c_type(table)), "table".to_string()),
        (format!("const {}*", c_type(ids)), "ids".to_string()),
        (format!("{}*", c_type(table)), "out".to_string()),
    ];
    let what = format!(
        "// ingot gather: {n} rows of {row_len} {} from a table of {rows} rows, by {} ids",
        table.name(),
        ids.name()
    );
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        split(src, t, ix, row_len);
        src.line("const long long id = (long long)ids[r];");
        src.line(format!(
            "out[e] = id >= 0ll && id < {rows}ll ? table[({t})id * {} + c] : {};",
            ix.lit(row_len),
            literal(0.0, table)
        ));
    }))
}

/// `scatter_add(ids [n], values [n, row_len]) -> out [rows, row_len]`, added into `out` (the
/// runtime zeroes it before the launch) with `atomicAdd`, so float sums come in a varying order;
/// ids outside `0..rows` are skipped. Params: ids, values, out. Values are f32, f64, i32 or i64
/// (integers wrap); ids i32 or i64.
pub fn scatter_add(
    ids: DType,
    values: DType,
    rows: usize,
    row_len: usize,
    n: usize,
) -> Result<CudaKernel, CodegenError> {
    check_ids("scatter_add", ids)?;
    if values == DType::Bool {
        return Err(CodegenError::Unsupported {
            op: "scatter_add",
            what: "values",
            dtype: values,
        });
    }
    let total = mul("scatter_add", &[n, row_len])?;
    let out_len = mul("scatter_add", &[rows, row_len])?;
    let ix = Ix::for_extents([total, out_len, n]);
    let params = [
        (format!("const {}*", c_type(ids)), "ids".to_string()),
        (format!("const {}*", c_type(values)), "values".to_string()),
        (format!("{}*", c_type(values)), "out".to_string()),
    ];
    let what = format!(
        "// ingot scatter_add: {n} rows of {row_len} {} added into {rows} rows, by {} ids",
        values.name(),
        ids.name()
    );
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        split(src, t, ix, row_len);
        src.line("const long long id = (long long)ids[r];");
        let at = format!("({t})id * {} + c", ix.lit(row_len));
        let add = match values {
            DType::I64 => format!(
                "atomicAdd((unsigned long long*)&out[{at}], (unsigned long long)values[e]);"
            ),
            _ => format!("atomicAdd(&out[{at}], values[e]);"),
        };
        src.line(format!("if (id >= 0ll && id < {rows}ll) {{ {add} }}"));
    }))
}

/// Concat along an axis: input `i` is `[outer, widths[i]]` (row-major; widths already
/// multiplied by the inner size), the output `[outer, Σ widths]`. Params: the inputs in order,
/// then out.
pub fn concat(dtype: DType, outer: usize, widths: &[usize]) -> Result<CudaKernel, CodegenError> {
    let too_large = || CodegenError::TooLarge {
        op: "concat",
        sizes: std::iter::once(outer)
            .chain(widths.iter().copied())
            .collect(),
    };
    let width = widths
        .iter()
        .try_fold(0usize, |a, &w| a.checked_add(w))
        .ok_or_else(too_large)?;
    let total = outer.checked_mul(width).ok_or_else(too_large)?;
    let ix = Ix::for_extents(
        std::iter::once(total).chain(widths.iter().map(|&w| outer.saturating_mul(w))),
    );
    let ty = c_type(dtype);
    let mut params: Vec<(String, String)> = widths
        .iter()
        .enumerate()
        .map(|(i, _)| (format!("const {ty}*"), format!("in{i}")))
        .collect();
    params.push((format!("{ty}*"), "out".to_string()));
    let what = format!(
        "// ingot concat: {} inputs of {outer} rows, widths {}, {}",
        widths.len(),
        super::list(widths),
        dtype.name()
    );
    Ok(elementwise_loop(&what, &params, total, ix, |src, t| {
        src.line(format!("const {t} o = e / {};", ix.lit(width)));
        src.line(format!("const {t} c = e - o * {};", ix.lit(width)));
        let nonzero: Vec<usize> = (0..widths.len()).filter(|&i| widths[i] > 0).collect();
        let mut start = 0usize;
        let mut starts = vec![0usize; widths.len()];
        for (i, &w) in widths.iter().enumerate() {
            starts[i] = start;
            start += w;
        }
        for (q, &i) in nonzero.iter().enumerate() {
            let w = widths[i];
            let col = if starts[i] == 0 {
                "c".to_string()
            } else {
                format!("(c - {})", ix.lit(starts[i]))
            };
            let read = format!("out[e] = in{i}[o * {} + {col}];", ix.lit(w));
            let last = q + 1 == nonzero.len();
            let cond = format!("c < {}", ix.lit(starts[i] + w));
            let line = match (q, last) {
                (0, true) => format!("{{ {read} }}"),
                (0, false) => format!("if ({cond}) {{ {read} }}"),
                (_, false) => format!("else if ({cond}) {{ {read} }}"),
                (_, true) => format!("else {{ {read} }}"),
            };
            src.line(line);
        }
    }))
}

fn check_ids(op: &'static str, ids: DType) -> Result<(), CodegenError> {
    match ids {
        DType::I32 | DType::I64 => Ok(()),
        _ => Err(CodegenError::Unsupported {
            op,
            what: "ids",
            dtype: ids,
        }),
    }
}

fn mul(op: &'static str, sizes: &[usize]) -> Result<usize, CodegenError> {
    sizes
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| CodegenError::TooLarge {
            op,
            sizes: sizes.to_vec(),
        })
}

/// `r` (the id's index) and `c` (the column) of the linear index `e` over `[_, row_len]`.
fn split(src: &mut Src, t: &str, ix: Ix, row_len: usize) {
    if row_len == 1 {
        src.line(format!("const {t} r = e;"));
        src.line(format!("const {t} c = {};", ix.lit(0)));
    } else {
        src.line(format!("const {t} r = e / {};", ix.lit(row_len)));
        src.line(format!("const {t} c = e - r * {};", ix.lit(row_len)));
    }
}

/// A kernel that runs `body` at every `e` in `0..total` (nothing when `total` is 0).
fn elementwise_loop(
    what: &str,
    params: &[(String, String)],
    total: usize,
    ix: Ix,
    body: impl FnOnce(&mut Src, &str),
) -> CudaKernel {
    let launch = Launch {
        grid: [grid_for(total, BLOCK as usize, MAX_GRID_ELEMENTWISE), 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    };
    let mut src = Src::default();
    src.line(what);
    src.line(format!(
        "// launch: grid [{},1,1], block [{},1,1]",
        launch.grid[0], launch.block[0]
    ));
    src.open(signature(BLOCK, params));
    if total > 0 {
        let t = ix.ty();
        src.open(format!(
            "for ({t} e = {}; e < {}; e += {}) {{",
            ix.global_thread(BLOCK),
            ix.lit(total),
            ix.grid_stride(BLOCK)
        ));
        body(&mut src, t);
        src.close();
    } else {
        src.line("// nothing to compute");
    }
    src.close();
    finish(src.text, launch)
}
