//! Optimizers as IR: the update of every parameter and its state is appended to the step graph
//! and marked as written in place.

mod settings;

pub use settings::{parse_betas, Optimizer, OptimizerKind, OptimizerSettings};

use crate::error::{IrError, Result};
use crate::ir::{DType, Graph, Init, LeafKind, NodeId, Shape, TensorType};

/// The name of the shared step counter that AdamW keeps as state, or, with
/// [`super::StepOptions::step_input`], of the f64 scalar input the host writes before each step
/// (the 1-based number of the update being made).
pub const STEP_COUNTER: &str = "step";

impl Optimizer {
    /// Appends the update of every parameter (given its gradient) to `g` and declares each new
    /// value, and each new optimizer state, as an in-place update of its leaf.
    pub fn apply(&self, g: &mut Graph, params: &[NodeId], grads: &[NodeId]) -> Result<()> {
        self.apply_scaled(g, params, grads, None)
    }

    /// As [`Optimizer::apply`], with the learning rate multiplied by `lr_scale` (an f64 scalar
    /// node, e.g. an input the host writes each step from a schedule, as PyTorch's `LambdaLR`
    /// scales the base lr). `None` builds exactly [`Optimizer::apply`]'s graph.
    pub fn apply_scaled(
        &self,
        g: &mut Graph,
        params: &[NodeId],
        grads: &[NodeId],
        lr_scale: Option<NodeId>,
    ) -> Result<()> {
        self.apply_with_inputs(g, params, grads, lr_scale, None)
    }

    /// As [`Optimizer::apply_scaled`], with AdamW's step number (bias corrections) read from
    /// `step`, an f64 scalar node the host writes before each step, instead of a counter kept
    /// as state: one compiled step then serves a run resumed at any step. Other optimizers
    /// have no step number and ignore it.
    pub fn apply_with_inputs(
        &self,
        g: &mut Graph,
        params: &[NodeId],
        grads: &[NodeId],
        lr_scale: Option<NodeId>,
        step: Option<NodeId>,
    ) -> Result<()> {
        if params.len() != grads.len() {
            return Err(IrError::Invalid(format!(
                "{} parameters but {} gradients",
                params.len(),
                grads.len()
            )));
        }
        match *self {
            Optimizer::Sgd { lr } => {
                for (&p, &gp) in params.iter().zip(grads) {
                    // torch: p.add_(g, alpha=-lr)
                    let step = scaled(g, gp, -lr, lr_scale)?;
                    let new = g.add(p, step)?;
                    g.set_update(p, new)?;
                }
                Ok(())
            }
            Optimizer::Momentum {
                lr,
                momentum,
                weight_decay,
            } => sgd_momentum(g, params, grads, lr, momentum, weight_decay, lr_scale),
            Optimizer::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => adamw(
                g,
                params,
                grads,
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                lr_scale,
                step,
            ),
        }
    }
}

/// The name and type of the parameter leaf `p`, whose optimizer state is named after it.
fn leaf_of(g: &Graph, p: NodeId) -> Result<(String, TensorType)> {
    let name = g
        .leaf_name(p)
        .ok_or_else(|| IrError::Invalid(format!("{p} is not a parameter leaf")))?;
    Ok((name.to_string(), g.ty(p).clone()))
}

/// `torch.optim.SGD(lr, momentum, weight_decay)` (single-tensor path, dampening 0, not
/// Nesterov): `d = g + wd * p`; `buf = momentum * buf + d` (PyTorch's first step sets
/// `buf = d`, which is the same from a zero buffer); `p -= lr * buf`.
fn sgd_momentum(
    g: &mut Graph,
    params: &[NodeId],
    grads: &[NodeId],
    lr: f64,
    momentum: f64,
    weight_decay: f64,
    lr_scale: Option<NodeId>,
) -> Result<()> {
    for (&p, &gp) in params.iter().zip(grads) {
        let (name, ty) = leaf_of(g, p)?;
        let d = if weight_decay != 0.0 {
            let wp = g.mul_scalar(p, weight_decay)?;
            g.add(gp, wp)?
        } else {
            gp
        };
        let d = if momentum != 0.0 {
            let buf = g.state(
                &format!("{name}.momentum_buffer"),
                ty.shape.clone(),
                ty.dtype,
                Init::Zeros,
            )?;
            let kept = g.mul_scalar(buf, momentum)?;
            let new = g.add(kept, d)?;
            g.set_update(buf, new)?;
            new
        } else {
            d
        };
        let step = scaled(g, d, -lr, lr_scale)?;
        let new = g.add(p, step)?;
        g.set_update(p, new)?;
    }
    Ok(())
}

/// `x * c`, or `x * (c * scale)` with `scale` an f64 scalar node (converted to `x`'s dtype).
fn scaled(g: &mut Graph, x: NodeId, c: f64, scale: Option<NodeId>) -> Result<NodeId> {
    match scale {
        None => g.mul_scalar(x, c),
        Some(s) => {
            let k = g.mul_scalar(s, c)?;
            let k = g.convert(k, g.ty(x).dtype)?;
            g.mul(x, k)
        }
    }
}

/// `torch.optim.AdamW` (single-tensor path), with the step counter and the bias corrections
/// computed in f64 as PyTorch computes them in Python floats, then rounded to the parameter's
/// dtype once.
#[allow(clippy::too_many_arguments)]
fn adamw(
    g: &mut Graph,
    params: &[NodeId],
    grads: &[NodeId],
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    lr_scale: Option<NodeId>,
    step_input: Option<NodeId>,
) -> Result<()> {
    let t = match step_input {
        Some(t) => t,
        None => {
            let step = g.state(STEP_COUNTER, Shape::scalar(), DType::F64, Init::Zeros)?;
            let t = g.add_scalar(step, 1.0)?;
            g.set_update(step, t)?;
            t
        }
    };
    // beta^t = exp(t ln beta); bias corrections 1 - beta^t.
    let pow = |g: &mut Graph, beta: f64| -> Result<NodeId> {
        let e = g.mul_scalar(t, beta.ln())?;
        g.exp(e)
    };
    let b1t = pow(g, beta1)?;
    let b2t = pow(g, beta2)?;
    let one = g.full(1.0, Shape::scalar(), DType::F64)?;
    let bc1 = g.sub(one, b1t)?;
    let bc2 = g.sub(one, b2t)?;
    let lr_k = match lr_scale {
        None => g.full(-lr, Shape::scalar(), DType::F64)?,
        Some(s) => g.mul_scalar(s, -lr)?,
    };
    let neg_step_size = g.div(lr_k, bc1)?;
    let bc2_sqrt = g.sqrt(bc2)?;
    let mut scalars: Vec<(DType, NodeId, NodeId)> = Vec::new();
    for (&p, &gp) in params.iter().zip(grads) {
        let (name, ty) = leaf_of(g, p)?;
        if !matches!(
            g.node(p).op,
            crate::ir::Op::Leaf {
                kind: LeafKind::Parameter,
                ..
            }
        ) {
            return Err(IrError::Invalid(format!("{name} is not a parameter")));
        }
        let dt = ty.dtype;
        let (neg_step, bc2s) = match scalars.iter().find(|s| s.0 == dt) {
            Some(&(_, a, b)) => (a, b),
            None => {
                let a = g.convert(neg_step_size, dt)?;
                let b = g.convert(bc2_sqrt, dt)?;
                scalars.push((dt, a, b));
                (a, b)
            }
        };
        // The moments: zero-initialised state shaped like the parameter.
        let moment = |g: &mut Graph, what: &str| {
            g.state(&format!("{name}.{what}"), ty.shape.clone(), dt, Init::Zeros)
        };
        let m = moment(g, "exp_avg")?;
        let v = moment(g, "exp_avg_sq")?;
        // p *= 1 - lr * wd
        let decayed = match lr_scale {
            None => g.mul_scalar(p, 1.0 - lr * weight_decay)?,
            Some(s) => {
                let f = g.mul_scalar(s, -lr * weight_decay)?;
                let f = g.add_scalar(f, 1.0)?;
                let f = g.convert(f, dt)?;
                g.mul(p, f)?
            }
        };
        // m.lerp_(g, 1 - beta1):  m + (1 - beta1) * (g - m)
        let diff = g.sub(gp, m)?;
        let diff = g.mul_scalar(diff, 1.0 - beta1)?;
        let m_new = g.add(m, diff)?;
        // v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        let vb = g.mul_scalar(v, beta2)?;
        let gg = g.mul_scalar(gp, 1.0 - beta2)?;
        let gg = g.mul(gg, gp)?;
        let v_new = g.add(vb, gg)?;
        // denom = sqrt(v) / sqrt(bc2) + eps ;  p.addcdiv_(m, denom, value=-lr/bc1)
        let root = g.sqrt(v_new)?;
        let denom = g.div(root, bc2s)?;
        let denom = g.add_scalar(denom, eps)?;
        let ratio = g.div(m_new, denom)?;
        let delta = g.mul(ratio, neg_step)?;
        let p_new = g.add(decayed, delta)?;
        g.set_update(p, p_new)?;
        g.set_update(m, m_new)?;
        g.set_update(v, v_new)?;
    }
    Ok(())
}
