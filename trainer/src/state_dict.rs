//! A model's weight file as PyTorch writes it: a whole `state_dict` (parameters, batch norms'
//! running statistics, `num_batches_tracked`), which `init` reads and `save` writes so that
//! `model.load_state_dict` takes the trained weights back. One mechanism for every model with
//! batch norms: an imported one ([`StateDict::new`], from the ONNX file) and a built-in or
//! IR-file one ([`StateDict::of_running_stats`], from the session's state), so that a
//! torchvision ResNet's `state_dict` loads into `resnet:depth=50` and back.
//!
//! Tied weights: transformers' GPT-2 ties `lm_head.weight` to `transformer.wte.weight` (one
//! tensor, two names in `model.state_dict()`), and the ONNX export keeps one initializer. A
//! name of the file that is no leaf of the model but holds, bit for bit, a parameter the same
//! file gives is that parameter's alias: recorded (the run says so), trained as the one tensor
//! it is, and written again under its own name by `--save` with the trained value, so that
//! PyTorch's strict `load_state_dict` takes the file back. An alias whose values differ from
//! its twin is refused naming both. safetensors' `save_model`, which keeps one name of a tied
//! pair and records the other in the file's metadata (`{"dropped": "kept"}`), is read the same
//! way: the model's parameter the file lacks is loaded from the name the metadata gives.

use crate::session::Session;
use indexmap::IndexMap;
use ingot_runtime::tensor::Tensor;
use std::collections::BTreeMap;

/// PyTorch's suffix of a batch norm's count of training batches (an i64 scalar buffer).
const TRACKED: &str = "num_batches_tracked";

/// How an imported model's weights map onto a PyTorch `state_dict`: its parameters, its batch
/// norms' running statistics (state the training step updates), and each batch norm's
/// `num_batches_tracked` (named after its `running_mean`), which the ONNX graph never reads.
#[derive(Clone, Debug, Default)]
pub struct StateDict {
    /// The running statistics, by name.
    running: IndexMap<String, ingot_compiler::ir::TensorType>,
    /// `{module}.num_batches_tracked` for each `{module}.running_mean`, with the count read
    /// by `--init` (0 otherwise).
    tracked: IndexMap<String, i64>,
    /// The file's initializers that are not leaves (constants Ingot computes or folded).
    computed: std::collections::HashSet<String>,
    /// Names `--init` read and ignored, for the run's header.
    pub ignored: Vec<String>,
    /// Tied aliases: a `state_dict` name that is no leaf of the model → the parameter it
    /// holds (see the module docs), in the file's order.
    tied: IndexMap<String, String>,
}

impl StateDict {
    /// The state_dict of a model whose running statistics are `running` (by name, with their
    /// types) and whose file holds `computed` buffers that Ingot computes rather than stores.
    pub fn new(
        running: IndexMap<String, ingot_compiler::ir::TensorType>,
        computed: std::collections::HashSet<String>,
    ) -> StateDict {
        let tracked = running
            .keys()
            .filter_map(|k| k.strip_suffix("running_mean"))
            .map(|m| (format!("{m}{TRACKED}"), 0))
            .collect();
        StateDict {
            running,
            tracked,
            computed,
            ignored: Vec::new(),
            tied: IndexMap::new(),
        }
    }

    /// The state_dict of the model `session` trains, where its resident state holds batch
    /// norms' running statistics (`{module}.running_mean` and `{module}.running_var`, as
    /// [`ingot_compiler::trace::nn::batch_norm2d`] names them): those, and each module's
    /// `num_batches_tracked`. `None` for a model without them, whose weight file is its
    /// parameters alone.
    pub fn of_running_stats(session: &Session) -> Option<StateDict> {
        let running: IndexMap<String, ingot_compiler::ir::TensorType> = session
            .optimizer_state()
            .into_iter()
            .filter(|(k, _)| k.ends_with(".running_mean") || k.ends_with(".running_var"))
            .map(|(k, t)| (k, t.ty))
            .collect();
        (!running.is_empty()).then(|| StateDict::new(running, Default::default()))
    }

    /// The tied aliases `--init` found (alias → the parameter it holds).
    pub fn tied(&self) -> &IndexMap<String, String> {
        &self.tied
    }

    /// Sets the tied aliases (a resumed run's, from its checkpoint), for `--save`.
    pub fn set_tied(&mut self, tied: IndexMap<String, String>) {
        self.tied = tied;
    }

    /// Each batch norm's `num_batches_tracked` before the run's first step (as `--init` read
    /// it; 0 otherwise), by name.
    pub fn tracked(&self) -> &IndexMap<String, i64> {
        &self.tracked
    }

    /// Sets the counts before the first step (a resumed run's, from its checkpoint), for
    /// `--save`: names the model does not have are ignored.
    pub fn set_tracked(&mut self, tracked: &IndexMap<String, i64>) {
        for (name, &count) in tracked {
            if let Some(slot) = self.tracked.get_mut(name) {
                *slot = count;
            }
        }
    }

    /// Loads a `state_dict` (`--init`): parameters by name (every one there, shapes checked,
    /// as for any model), running statistics (shapes and dtypes checked; one missing keeps
    /// the model file's), `num_batches_tracked` (kept for `--save`), and buffers of the file
    /// that Ingot computes rather than stores (a causal mask: ignored), and tied aliases (a
    /// name bit-equal to a parameter the file gives, or named by safetensors' `metadata` as
    /// the kept name of a parameter the file lacks). Any other name is an error listing it.
    /// On error nothing changes.
    pub fn load_init(
        &mut self,
        session: &mut Session,
        dict: &IndexMap<String, Tensor>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let params_known = session.parameters();
        let mut params = IndexMap::new();
        let mut state = session.optimizer_state();
        let mut tracked = self.tracked.clone();
        let mut ignored = Vec::new();
        let mut unknown = Vec::new();
        for (name, t) in dict {
            if params_known.contains_key(name) {
                params.insert(name.clone(), t.clone());
            } else if let Some(ty) = self.running.get(name) {
                if &t.ty != ty {
                    return Err(format!(
                        "{name} is {}, but the model's running statistic is {ty}",
                        t.ty
                    ));
                }
                state.insert(name.clone(), t.clone());
            } else if let Some(slot) = tracked.get_mut(name) {
                match (t.numel(), t.as_i64()) {
                    (1, Some(v)) => *slot = v[0],
                    _ => {
                        return Err(format!(
                            "{name} is {}, not PyTorch's count of batches (an i64 scalar)",
                            t.ty
                        ))
                    }
                }
            } else if self.computed.contains(name) || name.ends_with(TRACKED) {
                ignored.push(name.clone());
            } else {
                unknown.push(name.clone());
            }
        }
        let tied = tied_aliases(&params_known, &mut params, dict, metadata, &mut unknown)?;
        if !unknown.is_empty() {
            return Err(format!(
                "names that are not the model's parameters, running statistics or buffers, nor tied to one (bit-equal to a parameter the file gives): {unknown:?} (the model's parameters are named as PyTorch's state_dict names them: {:?}{})",
                params_known.keys().take(4).collect::<Vec<_>>(),
                if params_known.len() > 4 { ", ..." } else { "" }
            ));
        }
        session
            .load_parameters(&params)
            .map_err(|e| e.to_string())?;
        session
            .load_optimizer_state(&state)
            .map_err(|e| e.to_string())?;
        self.tracked = tracked;
        self.ignored = ignored;
        self.tied = tied;
        Ok(())
    }

    /// What `--save` writes besides the parameters (`params`, as the session holds them) so
    /// that `load_state_dict` takes the file back: the running statistics as the session
    /// holds them, each batch norm's `num_batches_tracked` advanced by the `steps` trained,
    /// and each tied alias holding its parameter's value.
    pub fn extra(
        &self,
        session: &Session,
        steps: u64,
        params: &IndexMap<String, Tensor>,
    ) -> IndexMap<String, Tensor> {
        let state = session.optimizer_state();
        let mut out: IndexMap<String, Tensor> = self
            .running
            .keys()
            .filter_map(|k| state.get(k).map(|t| (k.clone(), t.clone())))
            .collect();
        for (k, &v) in &self.tracked {
            out.insert(k.clone(), Tensor::scalar(v + steps as i64));
        }
        for (alias, param) in &self.tied {
            if let Some(t) = params.get(param) {
                out.insert(alias.clone(), t.clone());
            }
        }
        out
    }
}

/// Resolves the file's `unknown` names that are tied aliases (see the module docs), removing
/// them from `unknown`: first a parameter the file lacks whose name safetensors' `metadata`
/// maps to a name the file holds (loaded into `params` from it), then a name bit-equal to
/// exactly one parameter the file gives. Returns alias → parameter. A name bit-equal to
/// several parameters is an error naming them (which one is its twin is not known), and so is
/// a name of the type of exactly one given parameter but other values, naming both.
fn tied_aliases(
    known: &IndexMap<String, Tensor>,
    params: &mut IndexMap<String, Tensor>,
    dict: &IndexMap<String, Tensor>,
    metadata: &BTreeMap<String, String>,
    unknown: &mut Vec<String>,
) -> Result<IndexMap<String, String>, String> {
    let mut tied = IndexMap::new();
    for (param, leaf) in known {
        if params.contains_key(param) {
            continue;
        }
        let Some(kept) = metadata.get(param).filter(|k| unknown.contains(k)) else {
            continue;
        };
        let t = &dict[kept];
        if t.ty != leaf.ty {
            return Err(format!(
                "{kept} is {}, but the file's metadata names it as the tensor of the model's parameter {param} ({}): a tied pair holds one tensor",
                t.ty, leaf.ty
            ));
        }
        params.insert(param.clone(), t.clone());
        tied.insert(kept.clone(), param.clone());
    }
    unknown.retain(|u| !tied.contains_key(u));
    let mut rest = Vec::new();
    for u in unknown.drain(..) {
        let t = &dict[&u];
        let bytes = t.to_le_bytes();
        let same_type: Vec<&String> = params
            .iter()
            .filter(|(k, p)| p.ty == t.ty && !tied.contains_key(*k))
            .map(|(k, _)| k)
            .collect();
        let twins: Vec<&String> = same_type
            .iter()
            .filter(|k| params[k.as_str()].to_le_bytes() == bytes)
            .copied()
            .collect();
        match twins.as_slice() {
            [twin] => {
                tied.insert(u.clone(), (*twin).clone());
            }
            [_, _, ..] => {
                // (Freshly initialised biases are all zeros: equal values do not say which.)
                return Err(format!(
                    "{u} is not a parameter of the model, and it equals several of its parameters bit for bit ({twins:?}): Ingot cannot tell which one it is tied to (save the state_dict with safetensors' save_model, whose metadata names the tensor a dropped name shares, or with trained weights)"
                ));
            }
            [] if same_type.len() == 1 => {
                return Err(format!(
                    "{u} is not a parameter of the model, and its twin of the same shape and dtype ({}, {}) holds other values: a tied alias (PyTorch's second name of one tensor, as GPT-2's lm_head.weight is transformer.wte.weight) must equal its parameter bit for bit",
                    same_type[0], t.ty
                ));
            }
            [] => rest.push(u),
        }
    }
    *unknown = rest;
    Ok(tied)
}
