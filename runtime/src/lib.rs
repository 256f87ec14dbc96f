//! Ingot runtime.
