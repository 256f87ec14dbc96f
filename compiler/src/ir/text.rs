//! The text form (written by a colleague).
