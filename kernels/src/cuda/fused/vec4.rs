//! The elementwise strategy four elements a thread: 16-byte vector loads and stores (8-byte
//! ones for bf16) where every access allows them (see [`Analysis::vec4_inputs`]). Separate from the plain loop
//! because its addresses count in vectors and its body is written once per lane.

use super::space::{join, Space};
use super::Analysis;
use crate::cuda::{
    grid_for, reg_type, signature, CodegenError, Launch, Src, BLOCK, MAX_GRID_ELEMENTWISE,
};
use crate::fused::Inst;
use crate::DType;

/// Elementwise kernels of at least this many elements may go four elements a thread. Measured
/// on an H200: 20-28% faster at 6.3M and 25M elements (GPT-2's head copies and MLP
/// activations), 3% at 38.6M (its embedding's AdamW), but 1-3% slower at 0.8M to 2.4M and on
/// tiny kernels (fewer, longer threads where there is less to hide latency with).
pub(super) const VEC4_MIN_NUMEL: usize = 1 << 22;

/// The CUDA vector type of four elements of `d` in memory, where 16-, 8- or 4-byte vectors
/// exist (bf16's four are an `ushort4`: each lane widens on load and narrows on store).
pub(super) fn vec4_type(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("float4"),
        DType::I32 => Some("int4"),
        DType::Bool => Some("uchar4"),
        DType::BF16 => Some("ushort4"),
        DType::F64 | DType::I64 => None,
    }
}

impl Analysis<'_> {
    /// Whether the elementwise kernel goes four elements a thread through 4-element vector
    /// loads and stores: `Some((l, vector))`, `l` the innermost axis of size > 1, `vector[n]`
    /// whether input `n` is read four elements at a time (the others read one element for
    /// all four). The four elements `4e .. 4e + 3` of the linear index are consecutive along
    /// `l` when its size is a multiple of 4; then every output is a vector at `e`, and a load
    /// is one if it is contiguous along `l` (stride 1) and its element address at `4e` is a
    /// multiple of 4 (its offset and other strides are: buffers are 256-byte aligned, so the
    /// vector is aligned too), or one element if it is broadcast along `l` (stride 0). Vectors
    /// are of f32, i32, bool or bf16 (float4, int4, uchar4, ushort4; bf16's are 8 bytes, aligned
    /// by the same rule); a load of another type must be broadcast along `l`.
    pub(super) fn vec4_inputs(&self, used: &[bool]) -> Option<(usize, Vec<bool>)> {
        let k = self.k;
        let dims = &k.domain;
        let l = (0..dims.len()).rev().find(|&d| dims[d] > 1)?;
        if !dims[l].is_multiple_of(4) || self.numel < VEC4_MIN_NUMEL {
            return None;
        }
        if !(0..k.outputs.len()).all(|j| vec4_type(k.output_dtype(j)).is_some()) {
            return None;
        }
        let mut vector = vec![false; k.inputs.len()];
        for (n, inp) in k.inputs.iter().enumerate() {
            if !used[n] {
                continue;
            }
            let a = &inp.access;
            match a.strides[l] {
                0 => {}
                1 if vec4_type(inp.dtype).is_some()
                    && a.offset % 4 == 0
                    && (0..dims.len()).all(|d| d == l || dims[d] == 1 || a.strides[d] % 4 == 0) =>
                {
                    vector[n] = true
                }
                _ => return None,
            }
        }
        Some((l, vector))
    }

    /// The elementwise kernel four elements a thread (see [`Analysis::vec4_inputs`]): a
    /// grid-stride loop over the domain with axis `l` counted in fours; each iteration reads a
    /// vector of every input read that way ([`Analysis::vec4_loads`]), computes the body once
    /// per element in its own scope ([`Analysis::vec4_lane`]), and writes a vector of each
    /// output. A thread reads and writes only its own four elements, reads first.
    pub(super) fn elementwise_vec4(
        &self,
        l: usize,
        used: &[bool],
        vector: &[bool],
    ) -> Result<(String, Launch), CodegenError> {
        let (k, ix) = (self.k, self.ix);
        let quads = self.numel / 4;
        // The domain in fours along l; strides in vectors (of the inputs read as vectors) or
        // in elements (the others).
        let mut dims = k.domain.clone();
        dims[l] /= 4;
        let f = self.flat(&dims, used, |n| {
            let mut s = k.inputs[n].access.strides.clone();
            if vector[n] {
                for (d, x) in s.iter_mut().enumerate() {
                    *x = if d == l { 1 } else { *x / 4 };
                }
            }
            s
        });
        let launch = Launch {
            grid: [grid_for(quads, BLOCK as usize, MAX_GRID_ELEMENTWISE), 1, 1],
            block: [BLOCK, 1, 1],
            shared_bytes: 0,
        };
        let mut src = Src::default();
        self.header(
            &mut src,
            &format!("{} elements, 4 a thread along axis {l}", self.numel),
            &launch,
        );
        src.open(signature(BLOCK, &self.params()));
        self.open_grid_loop(&mut src, quads);
        self.decompose_for_loads(&mut src, &f, used);
        // Addresses: in vectors for the vector loads, in elements for the others.
        let addr = self.flat_addresses(&f, used, |n| {
            k.inputs[n].access.offset / if vector[n] { 4 } else { 1 }
        });
        self.vec4_loads(&mut src, &addr, vector);
        for j in 0..k.outputs.len() {
            let v = vec4_type(k.output_dtype(j)).unwrap_or("float4");
            src.line(format!("{v} r{j};"));
        }
        for (q, lane) in ["x", "y", "z", "w"].into_iter().enumerate() {
            self.vec4_lane(&mut src, &f.space, (l, q, lane), &addr, vector)?;
        }
        let out_addr = join(None, f.space.part(f.out_vec, "e", ix), ix);
        for j in 0..k.outputs.len() {
            src.line(format!(
                "reinterpret_cast<{}*>(out{j})[{out_addr}] = r{j};",
                vec4_type(k.output_dtype(j)).unwrap_or("float4")
            ));
        }
        src.close();
        src.close();
        Ok((src.text, launch))
    }

    /// Reads a vector of each input read four elements at a time (`l{n}`), before any lane.
    fn vec4_loads(&self, src: &mut Src, addr: &[String], vector: &[bool]) {
        for (n, inp) in self.k.inputs.iter().enumerate() {
            if vector[n] {
                src.line(format!(
                    "const {v} l{n} = reinterpret_cast<const {v}*>(in{n})[{}];",
                    addr[n],
                    v = vec4_type(inp.dtype).unwrap_or("float4")
                ));
            }
        }
    }

    /// The body at lane `q` (named `lane`) of the four elements along axis `l`, in its own
    /// scope: vector loads read their lane, the others as in the plain loop (index
    /// instructions along `l` at `4 x + q`); each output's lane of `r{j}` is set.
    fn vec4_lane(
        &self,
        src: &mut Src,
        space: &Space,
        (l, q, lane): (usize, usize, &str),
        addr: &[String],
        vector: &[bool],
    ) -> Result<(), CodegenError> {
        let (k, ix) = (self.k, self.ix);
        src.open("{");
        let axis = |d: usize| {
            let x = space.axis_var(d, ix);
            if d != l {
                x
            } else if q == 0 {
                format!("(4u * {x})")
            } else {
                format!("(4u * {x} + {q}u)")
            }
        };
        for i in (0..k.body.len()).filter(|&i| self.live[i]) {
            let ty = reg_type(self.dt[i]);
            match k.body[i] {
                Inst::Load { input } if vector[input] => src.line(format!(
                    "const {ty} v{i} = {};",
                    crate::cuda::widened(k.inputs[input].dtype, format!("l{input}.{lane}"))
                )),
                _ => {
                    let e = self.expr(i, addr, &axis)?;
                    src.line(format!("const {ty} v{i} = {e};"));
                }
            }
        }
        for (j, o) in k.outputs.iter().enumerate() {
            let v = crate::cuda::narrowed(k.output_dtype(j), format!("v{}", o.value));
            src.line(format!("r{j}.{lane} = {v};"));
        }
        src.close();
        Ok(())
    }
}
