//! What a plan keeps in host memory ([`crate::plan::offload`]): the report's offload section,
//! with the copies' schedule.

use super::bytes::human;
use crate::ir::Graph;
use crate::plan::MemoryPlan;
use serde::{Deserialize, Serialize};

/// The leaves a plan keeps in host memory, and the copies that move them each step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadReport {
    /// How many leaves live in the host region.
    pub values: usize,
    /// The host region's bytes (pinned memory on a GPU), beside the device's one allocation.
    pub host_bytes: usize,
    /// Copies per step: one in and one out per leaf.
    pub copies: usize,
    /// Bytes each step copies to the device, and as many back.
    pub bytes_each_way: usize,
    /// The copies in schedule order (of the copy in).
    pub schedule: Vec<OffloadCopy>,
}

/// One offloaded leaf's two copies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadCopy {
    pub name: String,
    pub bytes: usize,
    /// Copied to the device before the op at this schedule position.
    pub copy_in_before: usize,
    /// Copied back after the op at this position (its staging buffer dies there).
    pub copy_out_after: usize,
}

impl OffloadReport {
    /// The plan's offload, if it has any.
    pub fn of(g: &Graph, plan: &MemoryPlan) -> Option<OffloadReport> {
        if plan.offload.is_empty() {
            return None;
        }
        let mut schedule: Vec<OffloadCopy> = plan
            .offload
            .iter()
            .map(|o| OffloadCopy {
                name: g.leaf_name(o.leaf).unwrap_or_default().to_string(),
                bytes: o.host.bytes,
                copy_in_before: o.copy_in_before,
                copy_out_after: o.copy_out_after,
            })
            .collect();
        schedule.sort_by_key(|c| (c.copy_in_before, c.copy_out_after));
        Some(OffloadReport {
            values: plan.offload.len(),
            host_bytes: plan.host_bytes,
            copies: 2 * plan.offload.len(),
            bytes_each_way: plan.offload.iter().map(|o| o.host.bytes).sum(),
            schedule,
        })
    }

    /// `offloaded: 292 values, 9.88 GiB on the host, 584 copies (9.88 GiB each way per step)`.
    pub fn line(&self) -> String {
        format!(
            "offloaded: {} values, {} on the host, {} copies ({} each way per step)",
            self.values,
            human(self.host_bytes),
            self.copies,
            human(self.bytes_each_way)
        )
    }

    /// The copies' schedule, a line each (the first `most`, then how many more).
    pub fn schedule_lines(&self, most: usize) -> Vec<String> {
        let mut lines: Vec<String> = self
            .schedule
            .iter()
            .take(most)
            .map(|c| {
                format!(
                    "  {} ({}): in before position {}, out after {}",
                    crate::error::printable(&c.name),
                    human(c.bytes),
                    c.copy_in_before,
                    c.copy_out_after
                )
            })
            .collect();
        if self.schedule.len() > most {
            lines.push(format!("  ... {} more", self.schedule.len() - most));
        }
        lines
    }
}
