//! Memory planning: liveness, offsets in one slab, and a validator that shares no code with it.

pub mod dsa;
