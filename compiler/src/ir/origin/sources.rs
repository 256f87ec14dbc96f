//! The [`Origin`] value itself: a node's source names, merged and suffixed as passes rebuild
//! the graph. A leaf, so that a graph's nodes can hold one without reaching the passes over
//! whole graphs (printing with origins, filling in missing ones) in the module above.

use std::fmt;
use std::sync::Arc;

/// At most this many sources are kept when origins merge (an e-class of constants can hold
/// hundreds of nodes); the first ones, in order, are the ones kept.
pub const MAX_SOURCES: usize = 8;

/// Where a node came from: zero or more source names, in order. Cheap to clone (one `Arc`).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Origin(Option<Arc<[Arc<str>]>>);

impl Origin {
    /// No known origin, as a constant.
    pub const NONE: Origin = Origin(None);

    /// No known origin.
    pub fn none() -> Origin {
        Origin(None)
    }

    /// One source.
    pub fn new(source: &str) -> Origin {
        if source.is_empty() {
            return Origin(None);
        }
        Origin(Some(Arc::from(vec![Arc::<str>::from(source)])))
    }

    /// The sources, in order.
    pub fn sources(&self) -> &[Arc<str>] {
        self.0.as_deref().unwrap_or(&[])
    }

    pub fn is_empty(&self) -> bool {
        self.sources().is_empty()
    }

    /// The first source, the one a one-line label shows.
    pub fn primary(&self) -> Option<&str> {
        self.sources().first().map(|s| &**s)
    }

    /// The union of `origins`' sources: first occurrences, in order, at most [`MAX_SOURCES`].
    pub fn merge<'a>(origins: impl IntoIterator<Item = &'a Origin>) -> Origin {
        let mut out: Vec<Arc<str>> = Vec::new();
        let mut single: Option<&Origin> = None;
        let mut count = 0;
        for o in origins {
            if o.is_empty() {
                continue;
            }
            count += 1;
            if count == 1 {
                single = Some(o);
            }
            for s in o.sources() {
                if out.len() < MAX_SOURCES && !out.iter().any(|x| x == s) {
                    out.push(s.clone());
                }
            }
        }
        match (count, single) {
            // Share the one origin's allocation.
            (1, Some(o)) => o.clone(),
            _ if out.is_empty() => Origin(None),
            _ => Origin(Some(Arc::from(out))),
        }
    }

    /// Each source with `suffix` appended (once: a source already ending in it keeps it).
    pub fn with_suffix(&self, suffix: &str) -> Origin {
        if self.is_empty() || self.sources().iter().all(|s| s.ends_with(suffix)) {
            return self.clone();
        }
        let v: Vec<Arc<str>> = self
            .sources()
            .iter()
            .map(|s| {
                if s.ends_with(suffix) {
                    s.clone()
                } else {
                    Arc::from(format!("{s}{suffix}"))
                }
            })
            .collect();
        Origin(Some(Arc::from(v)))
    }

    /// The origin of the nodes autodiff makes for `self`'s node: `NAME (backward)`.
    pub fn backward(&self) -> Origin {
        self.with_suffix(" (backward)")
    }

    /// `blocks.3.qkv, blocks.3.attn` (all sources), or `?` when unknown.
    pub fn label(&self) -> String {
        if self.is_empty() {
            "?".into()
        } else {
            self.sources().join(", ")
        }
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.sources()).finish()
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl From<&str> for Origin {
    fn from(s: &str) -> Origin {
        Origin::new(s)
    }
}
