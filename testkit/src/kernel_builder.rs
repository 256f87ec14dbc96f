//! Building a [`FusedKernel`] by hand, an instruction at a time: the one builder of the kernel
//! tests (the CPU kernels' checks, the CUDA generator's host tests and the block emulations),
//! each of which used to carry its own copy. Every method that adds an instruction returns
//! its index, so a test reads as the formula it builds.

use ingot_kernels::fused::{Access, FusedKernel, Input, Inst, Output};
use ingot_kernels::{BinaryOp, DType, ReduceOp, UnaryOp};

/// A kernel under construction; `k` is public so a test can build a deliberately broken one.
pub struct KernelBuilder {
    pub k: FusedKernel,
}

impl KernelBuilder {
    /// An empty kernel over `domain`, reducing `reduce_axes`.
    pub fn new(domain: &[usize], reduce_axes: &[usize]) -> KernelBuilder {
        KernelBuilder {
            k: FusedKernel {
                domain: domain.to_vec(),
                reduce_axes: reduce_axes.to_vec(),
                inputs: vec![],
                body: vec![],
                outputs: vec![],
            },
        }
    }

    /// A new input of `dtype` read through `strides` from `offset`, one element past the last
    /// one the strides reach (what [`FusedKernel::check`] asks of every input, an empty
    /// domain's included).
    pub fn input_at(&mut self, dtype: DType, offset: usize, strides: &[usize]) -> usize {
        let reach = offset
            + self
                .k
                .domain
                .iter()
                .zip(strides)
                .map(|(&d, &s)| s * d.saturating_sub(1))
                .sum::<usize>();
        self.push_input(dtype, reach + 1, offset, strides)
    }

    /// A new input of `dtype` read through `strides` from offset 0, as long as they reach, and
    /// of no elements where the domain is empty (so a run over it takes an empty buffer).
    pub fn input(&mut self, dtype: DType, strides: &[usize]) -> usize {
        if self.k.domain.contains(&0) {
            self.push_input(dtype, 0, 0, strides)
        } else {
            self.input_at(dtype, 0, strides)
        }
    }

    fn push_input(&mut self, dtype: DType, len: usize, offset: usize, strides: &[usize]) -> usize {
        self.k.inputs.push(Input {
            dtype,
            len,
            access: Access {
                offset,
                strides: strides.to_vec(),
            },
        });
        self.k.inputs.len() - 1
    }

    /// A new contiguous input shaped like the domain.
    pub fn whole(&mut self, dtype: DType) -> usize {
        let s = Access::contiguous(&self.k.domain).strides;
        self.input(dtype, &s)
    }

    /// A new input shaped like the domain with the axes `bcast` broadcast (stride 0).
    pub fn input_bcast(&mut self, dtype: DType, bcast: &[usize]) -> usize {
        let dims: Vec<usize> = self
            .k
            .domain
            .iter()
            .enumerate()
            .map(|(d, &n)| if bcast.contains(&d) { 1 } else { n })
            .collect();
        let mut s = Access::contiguous(&dims).strides;
        for &a in bcast {
            s[a] = 0;
        }
        self.input_at(dtype, 0, &s)
    }

    /// Appends `inst` to the body.
    pub fn push(&mut self, inst: Inst) -> usize {
        self.k.body.push(inst);
        self.k.body.len() - 1
    }
    pub fn load(&mut self, input: usize) -> usize {
        self.push(Inst::Load { input })
    }
    /// An f32 constant.
    pub fn konst(&mut self, value: f64) -> usize {
        self.konst_of(value, DType::F32)
    }
    pub fn konst_of(&mut self, value: f64, dtype: DType) -> usize {
        self.push(Inst::Const { value, dtype })
    }
    pub fn to(&mut self, x: usize, to: DType) -> usize {
        self.push(Inst::Convert { x, to })
    }
    pub fn un(&mut self, op: UnaryOp, x: usize) -> usize {
        self.push(Inst::Unary { op, x })
    }
    pub fn bin(&mut self, op: BinaryOp, a: usize, b: usize) -> usize {
        self.push(Inst::Binary { op, a, b })
    }
    pub fn add(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Add, a, b)
    }
    pub fn sub(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Mul, a, b)
    }
    pub fn div(&mut self, a: usize, b: usize) -> usize {
        self.bin(BinaryOp::Div, a, b)
    }
    pub fn red(&mut self, op: ReduceOp, x: usize) -> usize {
        self.push(Inst::Reduce { op, x })
    }
    pub fn sum(&mut self, x: usize) -> usize {
        self.red(ReduceOp::Sum, x)
    }
    pub fn max(&mut self, x: usize) -> usize {
        self.red(ReduceOp::Max, x)
    }

    /// Makes `value` the next output.
    pub fn out(&mut self, value: usize) -> &mut KernelBuilder {
        self.k.outputs.push(Output { value });
        self
    }
    /// Makes `values` the next outputs, in order.
    pub fn outputs(&mut self, values: &[usize]) -> &mut KernelBuilder {
        for &v in values {
            self.out(v);
        }
        self
    }

    /// The kernel, which must pass [`FusedKernel::check`] (a test's kernel that does not is the
    /// test's mistake: the panic shows the error and the kernel).
    pub fn done(&self) -> FusedKernel {
        if let Err(e) = self.k.check() {
            panic!("the test kernel does not check: {e}\n{}", self.k);
        }
        self.k.clone()
    }
}
