//! Host tensors: a [`TensorType`] and a typed vector of elements in row-major order. The runtime,
//! the command-line program and the tests all pass values around as [`Tensor`]s; kernels see
//! borrowed, typed slices ([`View`], [`ViewMut`]).
//!
//! `bool` elements are stored one byte each, 0 or 1; `bf16` elements as [`half::bf16`].

use crate::error::ExecError;
pub use half::bf16;
use ingot_compiler::ir::{DType, Shape, TensorType};

/// The elements of a tensor, one vector variant per dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    /// 0 or 1 per element.
    Bool(Vec<u8>),
    BF16(Vec<bf16>),
}

/// What [`Tensor::non_finite`] found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonFinite {
    /// How many elements are NaN or infinite.
    pub count: usize,
    /// The first one's flat (row-major) index.
    pub first: usize,
    /// Its value: NaN, inf or -inf.
    pub value: f64,
}

/// Borrowed elements of one dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum View<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    Bool(&'a [u8]),
    BF16(&'a [bf16]),
}

/// Mutably borrowed elements of one dtype (an output buffer).
#[derive(Debug, PartialEq)]
pub enum ViewMut<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    I32(&'a mut [i32]),
    I64(&'a mut [i64]),
    Bool(&'a mut [u8]),
    BF16(&'a mut [bf16]),
}

/// A Rust type that stores one dtype: `f32`, `f64`, `i32`, `i64`, `bf16`, or `u8` for `bool`.
pub trait Element: Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// The elements if the view has this type.
    fn of<'a>(v: View<'a>) -> Option<&'a [Self]>;
    /// The elements if the view has this type.
    fn of_mut<'a>(v: ViewMut<'a>) -> Option<&'a mut [Self]>;
    /// Wraps a vector.
    fn into_data(v: Vec<Self>) -> Data;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn of<'a>(v: View<'a>) -> Option<&'a [Self]> {
                match v {
                    View::$variant(s) => Some(s),
                    _ => None,
                }
            }
            fn of_mut<'a>(v: ViewMut<'a>) -> Option<&'a mut [Self]> {
                match v {
                    ViewMut::$variant(s) => Some(s),
                    _ => None,
                }
            }
            fn into_data(v: Vec<Self>) -> Data {
                Data::$variant(v)
            }
        }
    };
}

element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(i64, I64);
element!(u8, Bool);
element!(bf16, BF16);

macro_rules! each {
    ($value:expr, $enum:ident, |$x:ident| $body:expr) => {
        match $value {
            $enum::F32($x) => $body,
            $enum::F64($x) => $body,
            $enum::I32($x) => $body,
            $enum::I64($x) => $body,
            $enum::Bool($x) => $body,
            $enum::BF16($x) => $body,
        }
    };
}

impl Data {
    /// `n` zeros (false for bool).
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::F64 => Data::F64(vec![0.0; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::I64 => Data::I64(vec![0; n]),
            DType::Bool => Data::Bool(vec![0; n]),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; n]),
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::Bool(_) => DType::Bool,
            Data::BF16(_) => DType::BF16,
        }
    }

    pub fn len(&self) -> usize {
        each!(self, Data, |v| v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn view(&self) -> View<'_> {
        match self {
            Data::F32(v) => View::F32(v),
            Data::F64(v) => View::F64(v),
            Data::I32(v) => View::I32(v),
            Data::I64(v) => View::I64(v),
            Data::Bool(v) => View::Bool(v),
            Data::BF16(v) => View::BF16(v),
        }
    }

    pub fn view_mut(&mut self) -> ViewMut<'_> {
        match self {
            Data::F32(v) => ViewMut::F32(v),
            Data::F64(v) => ViewMut::F64(v),
            Data::I32(v) => ViewMut::I32(v),
            Data::I64(v) => ViewMut::I64(v),
            Data::Bool(v) => ViewMut::Bool(v),
            Data::BF16(v) => ViewMut::BF16(v),
        }
    }
}

impl<'a> View<'a> {
    pub fn dtype(&self) -> DType {
        match self {
            View::F32(_) => DType::F32,
            View::F64(_) => DType::F64,
            View::I32(_) => DType::I32,
            View::I64(_) => DType::I64,
            View::Bool(_) => DType::Bool,
            View::BF16(_) => DType::BF16,
        }
    }

    pub fn len(&self) -> usize {
        each!(self, View, |v| v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as `T`, if the view holds `T`'s dtype.
    pub fn get<T: Element>(self) -> Option<&'a [T]> {
        T::of(self)
    }

    /// Element `i` as f64 (bool as 0 or 1; i64 beyond 2^53 rounds).
    pub fn f64_at(&self, i: usize) -> f64 {
        match self {
            View::F32(v) => v[i] as f64,
            View::F64(v) => v[i],
            View::I32(v) => v[i] as f64,
            View::I64(v) => v[i] as f64,
            View::Bool(v) => (v[i] != 0) as u8 as f64,
            View::BF16(v) => v[i].to_f64(),
        }
    }
}

impl<'a> ViewMut<'a> {
    pub fn dtype(&self) -> DType {
        match self {
            ViewMut::F32(_) => DType::F32,
            ViewMut::F64(_) => DType::F64,
            ViewMut::I32(_) => DType::I32,
            ViewMut::I64(_) => DType::I64,
            ViewMut::Bool(_) => DType::Bool,
            ViewMut::BF16(_) => DType::BF16,
        }
    }

    pub fn len(&self) -> usize {
        each!(self, ViewMut, |v| v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A shorter-lived mutable view of the same elements.
    pub fn reborrow(&mut self) -> ViewMut<'_> {
        match self {
            ViewMut::F32(v) => ViewMut::F32(v),
            ViewMut::F64(v) => ViewMut::F64(v),
            ViewMut::I32(v) => ViewMut::I32(v),
            ViewMut::I64(v) => ViewMut::I64(v),
            ViewMut::Bool(v) => ViewMut::Bool(v),
            ViewMut::BF16(v) => ViewMut::BF16(v),
        }
    }

    /// A read-only view of the same elements.
    pub fn as_view(&self) -> View<'_> {
        match self {
            ViewMut::F32(v) => View::F32(v),
            ViewMut::F64(v) => View::F64(v),
            ViewMut::I32(v) => View::I32(v),
            ViewMut::I64(v) => View::I64(v),
            ViewMut::Bool(v) => View::Bool(v),
            ViewMut::BF16(v) => View::BF16(v),
        }
    }

    /// The elements as `T`, if the view holds `T`'s dtype.
    pub fn get<T: Element>(self) -> Option<&'a mut [T]> {
        T::of_mut(self)
    }
}

/// A host tensor: its type and its elements in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub ty: TensorType,
    pub data: Data,
}

impl Tensor {
    /// A tensor from its type and elements, checking that they agree.
    pub fn new(ty: TensorType, data: Data) -> Result<Tensor, ExecError> {
        if data.dtype() != ty.dtype {
            return Err(ExecError::Data {
                ty,
                reason: format!("the elements are {}", data.dtype()),
            });
        }
        if data.len() != ty.shape.numel() {
            return Err(ExecError::Data {
                reason: format!("{} elements given, {} needed", data.len(), ty.shape.numel()),
                ty,
            });
        }
        Ok(Tensor { ty, data })
    }

    /// A tensor of element type `T`.
    ///
    /// # Panics
    /// If `values` does not hold exactly as many elements as `shape` has.
    pub fn from_vec<T: Element>(shape: impl Into<Shape>, values: Vec<T>) -> Tensor {
        let shape = shape.into();
        assert_eq!(
            values.len(),
            shape.numel(),
            "Tensor::from_vec: {} elements for shape {shape}",
            values.len()
        );
        Tensor {
            ty: TensorType::new(shape, T::DTYPE),
            data: T::into_data(values),
        }
    }

    /// An f32 tensor. Panics if the length does not match the shape.
    pub fn from_f32(shape: impl Into<Shape>, values: Vec<f32>) -> Tensor {
        Tensor::from_vec(shape, values)
    }

    /// An f64 tensor. Panics if the length does not match the shape.
    pub fn from_f64(shape: impl Into<Shape>, values: Vec<f64>) -> Tensor {
        Tensor::from_vec(shape, values)
    }

    /// An i32 tensor. Panics if the length does not match the shape.
    pub fn from_i32(shape: impl Into<Shape>, values: Vec<i32>) -> Tensor {
        Tensor::from_vec(shape, values)
    }

    /// A bf16 tensor, each value rounded to the nearest bf16 (ties to even). Panics if the
    /// length does not match the shape.
    pub fn from_f32_as_bf16(shape: impl Into<Shape>, values: &[f32]) -> Tensor {
        Tensor::from_vec(shape, values.iter().map(|&x| bf16::from_f32(x)).collect())
    }

    /// An i64 tensor. Panics if the length does not match the shape.
    pub fn from_i64(shape: impl Into<Shape>, values: Vec<i64>) -> Tensor {
        Tensor::from_vec(shape, values)
    }

    /// A bool tensor. Panics if the length does not match the shape.
    pub fn from_bool(shape: impl Into<Shape>, values: Vec<bool>) -> Tensor {
        Tensor::from_vec(shape, values.into_iter().map(u8::from).collect::<Vec<u8>>())
    }

    /// A rank-0 tensor of element type `T` (`Tensor::scalar(1.5f32)`).
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::from_vec(Shape::scalar(), vec![value])
    }

    /// Zeros (false for bool) of the given type.
    pub fn zeros(ty: TensorType) -> Tensor {
        let data = Data::zeros(ty.dtype, ty.shape.numel());
        Tensor { ty, data }
    }

    /// Every element `value`, converted as the `full` op does (`as` casts; nonzero is true).
    pub fn full(ty: TensorType, value: f64) -> Tensor {
        let n = ty.shape.numel();
        let data = match ty.dtype {
            DType::F32 => Data::F32(vec![value as f32; n]),
            DType::F64 => Data::F64(vec![value; n]),
            DType::I32 => Data::I32(vec![value as i32; n]),
            DType::I64 => Data::I64(vec![value as i64; n]),
            DType::Bool => Data::Bool(vec![(value != 0.0) as u8; n]),
            DType::BF16 => Data::BF16(vec![ingot_kernels::dtype::bf16_from_f64(value); n]),
        };
        Tensor { ty, data }
    }

    pub fn shape(&self) -> &Shape {
        &self.ty.shape
    }

    pub fn dims(&self) -> &[usize] {
        self.ty.shape.dims()
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn view(&self) -> View<'_> {
        self.data.view()
    }

    pub fn view_mut(&mut self) -> ViewMut<'_> {
        self.data.view_mut()
    }

    /// The elements as `T`, if the tensor holds `T`'s dtype.
    pub fn get<T: Element>(&self) -> Option<&[T]> {
        T::of(self.view())
    }

    /// The elements as `T`, if the tensor holds `T`'s dtype.
    pub fn get_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        T::of_mut(self.view_mut())
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        self.get()
    }
    pub fn as_f64(&self) -> Option<&[f64]> {
        self.get()
    }
    pub fn as_i32(&self) -> Option<&[i32]> {
        self.get()
    }
    pub fn as_i64(&self) -> Option<&[i64]> {
        self.get()
    }
    /// Bool elements, 0 or 1 each.
    pub fn as_bool(&self) -> Option<&[u8]> {
        self.get()
    }
    pub fn as_bf16(&self) -> Option<&[bf16]> {
        self.get()
    }
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        self.get_mut()
    }
    pub fn as_f64_mut(&mut self) -> Option<&mut [f64]> {
        self.get_mut()
    }

    /// Every element as f64, whatever the dtype (bool as 0 or 1; i64 beyond 2^53 rounds).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| (x != 0) as u8 as f64).collect(),
            Data::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
        }
    }

    /// The non-finite elements (NaN or infinite) of a float tensor: how many, and the first one's
    /// flat index and value; `None` when every element is finite (always, for integers and bool).
    pub fn non_finite(&self) -> Option<NonFinite> {
        fn scan<T: Copy>(
            v: &[T],
            finite: impl Fn(T) -> bool,
            f64_of: impl Fn(T) -> f64,
        ) -> Option<NonFinite> {
            let first = v.iter().position(|&x| !finite(x))?;
            let count = 1 + v[first + 1..].iter().filter(|&&x| !finite(x)).count();
            Some(NonFinite {
                count,
                first,
                value: f64_of(v[first]),
            })
        }
        match &self.data {
            Data::F32(v) => scan(v, f32::is_finite, |x| x as f64),
            Data::F64(v) => scan(v, f64::is_finite, |x| x),
            Data::BF16(v) => scan(v, |x| x.is_finite(), |x| x.to_f64()),
            Data::I32(_) | Data::I64(_) | Data::Bool(_) => None,
        }
    }

    /// The single element as f64, if the tensor has exactly one (a scalar, or any shape of
    /// one element).
    pub fn scalar_f64(&self) -> Option<f64> {
        (self.numel() == 1).then(|| self.view().f64_at(0))
    }

    /// The same elements under a new shape with as many elements.
    pub fn reshaped(self, shape: impl Into<Shape>) -> Result<Tensor, ExecError> {
        let ty = TensorType::new(shape, self.ty.dtype);
        Tensor::new(ty, self.data)
    }

    /// The elements as little-endian bytes (the safetensors layout).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::Bool(v) => v.clone(),
            Data::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        }
    }

    /// A tensor from little-endian bytes (the safetensors layout); bool bytes must be 0 or 1.
    pub fn from_le_bytes(ty: TensorType, bytes: &[u8]) -> Result<Tensor, ExecError> {
        let size = ty.dtype.size();
        if bytes.len() != ty.shape.numel() * size {
            return Err(ExecError::Data {
                reason: format!(
                    "{} bytes given, {} needed",
                    bytes.len(),
                    ty.shape.numel() * size
                ),
                ty,
            });
        }
        fn read<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
            bytes
                .chunks_exact(N)
                .map(|c| f(c.try_into().expect("chunks have N bytes")))
                .collect()
        }
        let data = match ty.dtype {
            DType::F32 => Data::F32(read(bytes, f32::from_le_bytes)),
            DType::F64 => Data::F64(read(bytes, f64::from_le_bytes)),
            DType::I32 => Data::I32(read(bytes, i32::from_le_bytes)),
            DType::I64 => Data::I64(read(bytes, i64::from_le_bytes)),
            DType::BF16 => Data::BF16(read(bytes, |b| bf16::from_bits(u16::from_le_bytes(b)))),
            DType::Bool => {
                if let Some(p) = bytes.iter().position(|&b| b > 1) {
                    return Err(ExecError::Data {
                        reason: format!("byte {p} is {}, not 0 or 1", bytes[p]),
                        ty,
                    });
                }
                Data::Bool(bytes.to_vec())
            }
        };
        Ok(Tensor { ty, data })
    }
}
