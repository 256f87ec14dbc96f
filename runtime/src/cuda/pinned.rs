//! Page-locked host buffers for the data loader's staging: the copy engine reads them directly,
//! so an input's copy to the GPU is truly asynchronous and the driver stages nothing.
//! Allocated once per run (two per input, by the trainer's data loader); and the host region of
//! an offloaded step's optimizer state ([`PinnedBuffer::readable`]), once per loaded step.

use crate::error::ExecError;
use cudarc::driver::{CudaContext, PinnedHostSlice};
use std::sync::Arc;

/// `len` bytes of page-locked host memory, usable as a plain byte slice.
pub struct PinnedBuffer {
    /// Owns the memory (freed on drop, after the work queued on it).
    _slice: PinnedHostSlice<u8>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value; access goes through `&`/`&mut`.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes (zeroed) in `ctx`, write-combined: fast for the host to fill and
    /// the GPU to read, slow for the host to read back (a data loader's staging).
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedBuffer, ExecError> {
        PinnedBuffer::with_flags(ctx, len, cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED)
    }

    /// Allocates `len` bytes (zeroed) in `ctx`, cached: the host reads them back at full speed
    /// (an offloaded leaf's home, read whole for every checkpoint).
    pub fn readable(ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedBuffer, ExecError> {
        PinnedBuffer::with_flags(ctx, len, 0)
    }

    fn with_flags(
        ctx: &Arc<CudaContext>,
        len: usize,
        flags: u32,
    ) -> Result<PinnedBuffer, ExecError> {
        let err = |e: cudarc::driver::DriverError| ExecError::Device {
            what: format!("allocating {len} bytes of page-locked host memory"),
            reason: e.to_string(),
        };
        ctx.bind_to_thread().map_err(err)?;
        // SAFETY: u8 is valid for any bits; the memory is zeroed below before any read.
        let mut slice =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(len.max(1), flags) }.map_err(err)?;
        let ptr = slice.as_mut_ptr().map_err(err)?;
        // SAFETY: `ptr` points at `len.max(1)` bytes owned by `slice`.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(PinnedBuffer {
            _slice: slice,
            ptr,
            len,
        })
    }
}

impl PinnedBuffer {
    /// The first byte, for an asynchronous copy into the buffer (the caller keeps the buffer
    /// alive and unread until the copy has finished).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
}

impl std::ops::Deref for PinnedBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` bytes for as long as `_slice` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for PinnedBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
