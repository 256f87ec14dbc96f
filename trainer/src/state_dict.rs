//! An imported model's weight file as PyTorch writes it: a whole `state_dict` (parameters,
//! batch norms' running statistics, `num_batches_tracked`), which `init` reads and `save`
//! writes so that `model.load_state_dict` takes the trained weights back.

use crate::session::Session;
use indexmap::IndexMap;
use ingot_runtime::tensor::Tensor;

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
        }
    }

    /// Loads a `state_dict` (`--init`): parameters by name (every one there, shapes checked,
    /// as for any model), running statistics (shapes and dtypes checked; one missing keeps
    /// the model file's), `num_batches_tracked` (kept for `--save`), and buffers of the file
    /// that Ingot computes rather than stores (a causal mask: ignored). Any other name is an
    /// error listing it. On error nothing changes.
    pub fn load_init(
        &mut self,
        session: &mut Session,
        dict: &IndexMap<String, Tensor>,
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
        if !unknown.is_empty() {
            return Err(format!(
                "names that are not the model's parameters, running statistics or buffers: {unknown:?} (the model's parameters are named as in the ONNX file: {:?}{})",
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
        Ok(())
    }

    /// What `--save` writes besides the parameters so that `load_state_dict` takes the file
    /// back: the running statistics as the session holds them, and each batch norm's
    /// `num_batches_tracked` advanced by the `steps` trained.
    pub fn extra(&self, session: &Session, steps: u64) -> IndexMap<String, Tensor> {
        let state = session.optimizer_state();
        let mut out: IndexMap<String, Tensor> = self
            .running
            .keys()
            .filter_map(|k| state.get(k).map(|t| (k.clone(), t.clone())))
            .collect();
        for (k, &v) in &self.tracked {
            out.insert(k.clone(), Tensor::scalar(v + steps as i64));
        }
        out
    }
}
