//! Examples live under src/bin/.
