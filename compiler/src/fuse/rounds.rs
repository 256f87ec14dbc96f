//! One-root lowerings kept from one round of fusion's lowering loop to the next.
//!
//! Each round of [`super::fuse_recomputing`]'s loop lowers every materialized value as a
//! one-root group; a round that finds cuts materializes them and starts again. A round's cuts
//! change the lowering of the few groups that expanded a value now stored, not the others: a
//! lowering reads `mat` only at the values it enters ([`lower_reading`] lists them), so a
//! lowering whose reads all still hold is the one lowering again would give, and is taken as it
//! is. Lowering every group again at every round made the loop's work the rounds times the
//! step's (three rounds for a deep GPT: more than half of fusion's instructions).

use super::group::Group;
use super::kind::{kind, Kind};
use super::lower::{lower_reading, Domain, Lowered, Reads};
use crate::ir::{Graph, NodeId};

/// A one-root lowering and the entries of `mat` it read.
struct Kept {
    lowered: Lowered,
    read: Reads,
}

/// Lowerings by root (node index), each valid while `mat` agrees with what it read.
#[derive(Default)]
pub(super) struct Lowerings {
    kept: Vec<Option<Kept>>,
}

impl Lowerings {
    /// The kept lowering of `root` if `mat` still agrees with every entry it read (an entry
    /// that disagrees drops it).
    fn take(&mut self, root: NodeId, mat: &[bool]) -> Option<Kept> {
        let kept = self.kept.get_mut(root.index())?.take()?;
        kept.read
            .iter()
            .all(|&(v, m)| mat[v.index()] == m)
            .then_some(kept)
    }

    fn keep(&mut self, root: NodeId, kept: Kept) {
        if self.kept.len() <= root.index() {
            self.kept.resize_with(root.index() + 1, || None);
        }
        self.kept[root.index()] = Some(kept);
    }

    /// Keeps the lowerings of one-root `groups` (a round that ended in cuts) for the next
    /// round; `reads` are their reads, in the same order.
    pub(super) fn keep_groups(&mut self, groups: Vec<Group>, reads: Vec<Reads>) {
        for (gr, read) in groups.into_iter().zip(reads) {
            let root = gr.roots[0];
            self.keep(
                root,
                Kept {
                    lowered: gr.lowered,
                    read,
                },
            );
        }
    }
}

/// A round's groups and, in the same order, the entries of `mat` each lowering read.
pub(super) type Round = (Vec<Group>, Vec<Reads>);

/// Lowers every materialized computed value as a one-root group, taking kept lowerings that
/// still hold; on failure, every cut (the groups that lowered are kept for the next round).
/// The groups are those lowering every value afresh gives, in node order.
pub(super) fn lower_all_keeping(
    g: &Graph,
    mat: &[bool],
    kept: &mut Lowerings,
) -> Result<Round, Vec<NodeId>> {
    let mut groups = Vec::new();
    let mut reads = Vec::new();
    let mut cuts = Vec::new();
    for id in g.ids() {
        if !mat[id.index()] || matches!(kind(g.node(id)), Kind::Leaf | Kind::Library) {
            continue;
        }
        let domain = Domain::of_root(g, id);
        if let Some(k) = kept.take(id, mat) {
            groups.push(Group {
                roots: vec![id],
                domain,
                lowered: k.lowered,
            });
            reads.push(k.read);
            continue;
        }
        match lower_reading(g, mat, &[id], &domain) {
            Ok((lowered, _, read)) => {
                groups.push(Group {
                    roots: vec![id],
                    domain,
                    lowered,
                });
                reads.push(read);
            }
            Err(c) => cuts.extend(c.into_iter().filter(|c| !mat[c.index()])),
        }
    }
    if cuts.is_empty() {
        Ok((groups, reads))
    } else {
        kept.keep_groups(groups, reads);
        Err(cuts)
    }
}

/// Lowers every materialized computed value as a one-root group; on failure, every cut.
pub(super) fn lower_all(g: &Graph, mat: &[bool]) -> Result<Vec<Group>, Vec<NodeId>> {
    lower_all_keeping(g, mat, &mut Lowerings::default()).map(|(groups, _)| groups)
}
