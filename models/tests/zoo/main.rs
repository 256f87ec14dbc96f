//! The model zoo's tests, as a user of the crate would write them (public items only).

mod gpt_decode;
mod reference;
mod sources;
mod spec;
