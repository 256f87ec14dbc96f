//! Default values of a step's leaves, from a seeded generator, so that runs repeat on every
//! machine: parameters and optimizer state from each leaf's [`Init`] (normal(0, std), zeros,
//! ones), and a synthetic batch for the inputs `x` and `y`.
//!
//! Every leaf draws from its own ChaCha8 stream: the key is the run's seed and the stream number
//! a fixed hash (FNV-1a) of the leaf's name. A tensor's values therefore depend only on the seed,
//! its name and its shape, not on which other leaves the graph has or in which order they come.
//! ChaCha8's stream is the same on every platform, and so are `rand_distr`'s samplers built on
//! it, except that the normal sampler's rare slow path calls the platform's `exp` and `ln` (which
//! agree across the usual 64-bit platforms); a test pins the first values drawn.
//!
//! Synthetic ids are uniform in `0..n`, where `n` is read off the model's parameters: an integer
//! `x` indexes the embedding table (`wte.weight`, else the first matrix parameter), so `n` is
//! its rows; `y` holds class ids or next tokens for the output layer, so `n` is the rows of the
//! last matrix parameter (`fc3.weight` of the mlp: 10; `head.weight` of a GPT: the vocabulary),
//! unless the input declares its bound (`Init::Ids`: an imported model's labels, whose class
//! count is its logits' class axis).
//! A float `x` is normal(0, 1).

use indexmap::IndexMap;
use ingot_compiler::autodiff::{copies, shard};
use ingot_compiler::ir::{DType, Graph, Init, LeafKind, Op, TensorType};
use ingot_runtime::tensor::{Data, Tensor};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal, Uniform};

/// The generator of the leaf named `name` under `seed`.
pub fn rng_for(seed: u64, name: &str) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(fnv1a(name.as_bytes()));
    rng
}

/// FNV-1a, 64 bits: a hash that is the same on every machine and in every build.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `n` samples of normal(mean, std) as `dtype` (floats only; sampled in f64 and rounded once).
fn normal(ty: &TensorType, mean: f64, std: f64, rng: &mut ChaCha8Rng) -> Tensor {
    let n = ty.shape.numel();
    let dist = Normal::new(mean, std.abs())
        .unwrap_or_else(|_| Normal::new(0.0, 0.0).expect("std 0 is valid"));
    let data = match ty.dtype {
        DType::F32 => Data::F32((0..n).map(|_| dist.sample(rng) as f32).collect()),
        DType::F64 => Data::F64((0..n).map(|_| dist.sample(rng)).collect()),
        // Integer leaves with a normal init do not occur; round rather than panic.
        DType::I32 => Data::I32((0..n).map(|_| dist.sample(rng).round() as i32).collect()),
        DType::I64 => Data::I64((0..n).map(|_| dist.sample(rng).round() as i64).collect()),
        DType::Bool => Data::Bool((0..n).map(|_| (dist.sample(rng) > 0.0) as u8).collect()),
        DType::BF16 => Data::BF16(
            (0..n)
                .map(|_| ingot_kernels::dtype::bf16_from_f64(dist.sample(rng)))
                .collect(),
        ),
    };
    Tensor {
        ty: ty.clone(),
        data,
    }
}

/// `n` samples of uniform on `[-bound, bound)` as `ty`'s float dtype (sampled in f64, rounded
/// once); integer and bool leaves with a uniform init do not occur and get zeros.
fn uniform(ty: &TensorType, bound: f64, rng: &mut ChaCha8Rng) -> Tensor {
    let n = ty.shape.numel();
    let b = if bound.is_finite() { bound.abs() } else { 0.0 };
    let mut draw = || {
        if b == 0.0 {
            0.0
        } else {
            Uniform::new(-b, b).expect("-b < b").sample(rng)
        }
    };
    let data = match ty.dtype {
        DType::F32 => Data::F32((0..n).map(|_| draw() as f32).collect()),
        DType::F64 => Data::F64((0..n).map(|_| draw()).collect()),
        DType::BF16 => Data::BF16(
            (0..n)
                .map(|_| ingot_kernels::dtype::bf16_from_f64(draw()))
                .collect(),
        ),
        _ => return Tensor::zeros(ty.clone()),
    };
    Tensor {
        ty: ty.clone(),
        data,
    }
}

/// The value of a leaf of type `ty` initialised by `init`, from the leaf's own stream.
pub fn init_leaf(seed: u64, name: &str, ty: &TensorType, init: &Init) -> Tensor {
    match *init {
        Init::Zeros => Tensor::zeros(ty.clone()),
        Init::Ones => Tensor::full(ty.clone(), 1.0),
        Init::Normal { std } => normal(ty, 0.0, std, &mut rng_for(seed, name)),
        Init::Uniform { bound } => uniform(ty, bound, &mut rng_for(seed, name)),
        // Only an integer input declares its ids (shape inference refuses it elsewhere);
        // inputs are drawn by `synthetic_batch`, not here.
        Init::Ids { .. } => Tensor::zeros(ty.clone()),
    }
}

/// The initial value of every leaf of `kind` in `g`, by name, in graph order. A parameter's
/// bf16 copy ([`ingot_compiler::autodiff::copies`]) is its parameter's initial value cast.
/// A leaf each rank holds its rows of (a sharded optimizer's) gets its whole value
/// ([`shard::whole_type`]): the value the unsharded step's leaf gets, of which each rank is
/// given its rows, so a sharded run starts where the unsharded one does.
pub fn init_leaves(g: &Graph, kind: LeafKind, seed: u64) -> IndexMap<String, Tensor> {
    let value = |id| match &g.node(id).op {
        Op::Leaf { name, init, .. } => Some((
            name.clone(),
            init_leaf(seed, name, &shard::whole_type(g, id), init),
        )),
        _ => None,
    };
    g.leaves(kind)
        .into_iter()
        .filter_map(|id| match copies::param_of(g, id) {
            Some(p) => {
                let (_, v) = value(p)?;
                Some((g.leaf_name(id)?.to_string(), bf16_copy(&v)?))
            }
            None => value(id),
        })
        .collect()
}

/// An f32 tensor cast to bf16 (rounded to nearest, ties to even, as the step's cast), for a
/// parameter's copy; `None` for another dtype.
pub fn bf16_copy(v: &Tensor) -> Option<Tensor> {
    Some(Tensor::from_f32_as_bf16(v.shape().clone(), v.as_f32()?))
}

/// The exclusive upper bound of the ids the integer input `name` (`x` or `y`) may hold, read off
/// the graph's parameters (see the module docs; in a forward-only bf16 step, the weight copies
/// it reads in their place), or `None` when the graph has no matrix parameter to
/// read it from. A parameter the ranks hold rows of counts all its rows (a
/// sharded head still has the whole vocabulary).
pub fn id_bound(g: &Graph, name: &str) -> Option<usize> {
    // Declared by the graph (an imported model's labels: its logits' class count).
    if let Some(Op::Leaf {
        init: Init::Ids { bound },
        ..
    }) = g.leaf(name).map(|id| &g.node(id).op)
    {
        return usize::try_from(*bound).ok();
    }
    let rows = |id| shard::whole_type(g, id).shape.dims().first().copied();
    if name == "x" {
        if let Some(id) = g.leaf("wte.weight").or_else(|| g.leaf("wte.weight.bf16")) {
            return rows(id);
        }
    }
    let matrices: Vec<_> = weights(g)
        .into_iter()
        .filter(|&id| g.ty(id).shape.rank() == 2)
        .collect();
    let table = if name == "x" {
        matrices.first()
    } else {
        matrices.last()
    };
    table.and_then(|&id| rows(id))
}

/// The weights of `g`, in graph order: its parameters, and each bf16 weight copy that stands
/// in for a parameter the graph does not hold. A forward-only step under bf16 reads its
/// weights through the training step's copies ([`copies::read_weight_copies`]), and the f32
/// parameters it no longer reads are not in its graph: their copies carry their shapes.
fn weights(g: &Graph) -> Vec<ingot_compiler::ir::NodeId> {
    g.ids()
        .filter(|&id| match &g.node(id).op {
            Op::Leaf {
                kind: LeafKind::Parameter,
                ..
            } => true,
            Op::Leaf {
                kind: LeafKind::State,
                name,
                ..
            } => {
                g.ty(id).dtype == DType::BF16
                    && name
                        .strip_suffix(copies::SUFFIX)
                        .is_some_and(|p| g.leaf(p).is_none())
            }
            _ => false,
        })
        .collect()
}

/// A synthetic value of every input leaf of `g`, by name, in graph order: integer inputs uniform
/// in `0..`[`id_bound`] (`0..1` where there is none), float inputs normal(0, 1).
pub fn synthetic_batch(g: &Graph, seed: u64) -> IndexMap<String, Tensor> {
    synthetic_union_batch(g, seed, 1)
}

/// [`synthetic_batch`] for `ranks` data-parallel ranks together: each input with a leading
/// axis (a batch) is drawn `ranks` times as long, rank `r`'s samples the `r`-th of `ranks`
/// equal parts, so that every rank trains on samples of its own, as it would on its shard of a
/// data set. The first rank's part is the one-rank batch (the draws continue one stream).
/// Scalars are drawn once.
pub fn synthetic_union_batch(g: &Graph, seed: u64, ranks: usize) -> IndexMap<String, Tensor> {
    let mut out = IndexMap::new();
    for id in g.leaves(LeafKind::Input) {
        let name = g.leaf_name(id).expect("leaves have names").to_string();
        let mut ty = g.ty(id).clone();
        if let Some(&d0) = ty.shape.dims().first() {
            let mut dims = ty.shape.dims().to_vec();
            dims[0] = d0 * ranks.max(1);
            ty.shape = ingot_compiler::ir::Shape::new(&dims);
        }
        let ty = &ty;
        let mut rng = rng_for(seed, &format!("batch/{name}"));
        let n = ty.shape.numel();
        let t = if ty.dtype.is_float() {
            normal(ty, 0.0, 1.0, &mut rng)
        } else {
            let hi = id_bound(g, &name).unwrap_or(1).max(1) as i64;
            let ids = Uniform::new(0i64, hi).expect("0 < hi");
            let data = match ty.dtype {
                DType::I32 => Data::I32((0..n).map(|_| ids.sample(&mut rng) as i32).collect()),
                DType::I64 => Data::I64((0..n).map(|_| ids.sample(&mut rng)).collect()),
                _ => Data::Bool((0..n).map(|_| ids.sample(&mut rng).min(1) as u8).collect()),
            };
            Tensor {
                ty: ty.clone(),
                data,
            }
        };
        out.insert(name, t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_models::{by_name, mlp_with};

    #[test]
    fn the_same_seed_gives_the_same_parameters_and_another_seed_different_ones() {
        let g = mlp_with(2, DType::F32).unwrap().graph;
        let a = init_leaves(&g, LeafKind::Parameter, 7);
        let b = init_leaves(&g, LeafKind::Parameter, 7);
        let c = init_leaves(&g, LeafKind::Parameter, 8);
        assert_eq!(a, b);
        assert_ne!(a["fc1.weight"], c["fc1.weight"]);
        // Biases are zeros whatever the seed.
        assert_eq!(a["fc1.bias"], c["fc1.bias"]);
    }

    #[test]
    fn weights_are_normal_with_the_leafs_std_biases_zero_and_gains_one() {
        let g = by_name("gpt:vocab=64,d_model=32,layers=1,heads=2,d_ff=64,seq=8,batch=2")
            .unwrap()
            .graph;
        let p = init_leaves(&g, LeafKind::Parameter, 0);
        let w = p["wte.weight"].as_f32().unwrap();
        let n = w.len() as f64;
        let mean = w.iter().map(|&v| v as f64).sum::<f64>() / n;
        let std = (w.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.002, "mean {mean}");
        assert!((std - 0.02).abs() < 0.002, "std {std}");
        let all = |name: &str, x: f32| p[name].as_f32().unwrap().iter().all(|&v| v == x);
        assert!(all("blocks.0.ln1.weight", 1.0));
        assert!(all("blocks.0.ln1.bias", 0.0));
        assert!(all("blocks.0.qkv.bias", 0.0));
    }

    #[test]
    fn two_weights_of_one_shape_get_different_values() {
        let g = by_name("gpt:vocab=16,d_model=16,layers=1,heads=2,d_ff=16,seq=4,batch=1")
            .unwrap()
            .graph;
        let p = init_leaves(&g, LeafKind::Parameter, 0);
        assert_ne!(p["wte.weight"], p["head.weight"]);
    }

    #[test]
    fn seeded_values_are_pinned_so_every_machine_draws_the_same() {
        // Guards against a dependency update changing the streams silently.
        let ty = TensorType::new([4], DType::F32);
        let t = init_leaf(0, "w", &ty, &Init::Normal { std: 1.0 });
        let again = init_leaf(0, "w", &ty, &Init::Normal { std: 1.0 });
        assert_eq!(t, again);
        let bits: Vec<u32> = t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, PINNED_BITS, "values {:?}", t.as_f32().unwrap());
    }

    const PINNED_BITS: [u32; 4] = [3206134436, 3211144898, 1063819576, 1073993647];

    #[test]
    fn synthetic_ids_lie_in_the_vocabulary_and_mlp_targets_in_the_ten_classes() {
        let g = by_name("gpt:vocab=37,d_model=8,layers=1,heads=2,d_ff=8,seq=16,batch=8")
            .unwrap()
            .graph;
        let b = synthetic_batch(&g, 3);
        for name in ["x", "y"] {
            let ids = b[name].as_i64().unwrap();
            assert!(ids.iter().all(|&i| (0..37).contains(&i)), "{name}");
            assert!(
                ids.iter().any(|&i| i > 30),
                "{name} never reaches the top of the range"
            );
        }
        let g = mlp_with(64, DType::F32).unwrap().graph;
        let b = synthetic_batch(&g, 3);
        let y = b["y"].as_i64().unwrap();
        assert!(y.iter().all(|&i| (0..10).contains(&i)));
        assert!(y.contains(&9) && y.contains(&0));
        assert_eq!(b["x"].dims(), [64, 784]);
        assert_eq!(b, synthetic_batch(&g, 3));
        assert_ne!(b, synthetic_batch(&g, 4));
    }
}
