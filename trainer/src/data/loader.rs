//! Input staging: a thread that fills the next batch into one of two buffers while the
//! current step runs on the other.
//!
//! The caller supplies the two buffer pairs ([`Staging`]), of any type that derefs to bytes:
//! plain `Vec<u8>` on the CPU, page-locked host memory for the CUDA copy engine. They are
//! allocated once, by the caller. The loader hands buffer *indices* back and forth through two
//! fixed-size queues under one mutex and condition variable (free -> worker, filled -> caller),
//! so nothing is allocated per batch, from the first batch on: `std::sync::mpsc` was tried and
//! allocates the first time each thread blocks, at a time that depends on scheduling
//! (`tests/data_loader.rs` counts).
//!
//! Order is kept: the worker fills batches in cursor order and the caller receives them in
//! that order. [`Staged::info`] carries the position to save once the step that used the
//! batch is done.

use super::batches::{BatchInfo, BatchSource, Epochs};
use super::error::DataError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// One batch's buffers: the bytes of input `x` and of input `y`.
#[derive(Debug)]
pub struct Staging<B> {
    pub x: B,
    pub y: B,
}

/// What the worker reports for a buffer: filled with a batch, the end, or an error.
type Message = Result<Option<(usize, BatchInfo)>, DataError>;

/// A first-in first-out queue of at most `N` items, in place.
struct Ring<T, const N: usize> {
    items: [Option<T>; N],
    head: usize,
    len: usize,
}

impl<T, const N: usize> Ring<T, N> {
    fn new() -> Self {
        Ring {
            items: std::array::from_fn(|_| None),
            head: 0,
            len: 0,
        }
    }
    fn push(&mut self, v: T) {
        assert!(self.len < N, "at most {N} items are ever queued");
        self.items[(self.head + self.len) % N] = Some(v);
        self.len += 1;
    }
    fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.items[self.head].take();
        self.head = (self.head + 1) % N;
        self.len -= 1;
        v
    }
}

/// The hand-off state shared by the caller and the worker.
struct State {
    /// Buffers the worker may fill.
    free: Ring<usize, 2>,
    /// Buffers filled (or the end, or an error), in order. At most one message per buffer
    /// plus the last one.
    ready: Ring<Message, 3>,
    /// The loader is being dropped: the worker stops.
    closed: bool,
    /// The worker has returned (or panicked).
    exited: bool,
}

struct Shared<B> {
    state: Mutex<State>,
    changed: Condvar,
    buffers: [Mutex<Staging<B>>; 2],
}

impl<B> Shared<B> {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// The loader thread and its two buffers.
pub struct Loader<B: Send + 'static> {
    shared: Option<Arc<Shared<B>>>,
    worker: Option<JoinHandle<()>>,
    finished: bool,
}

/// A filled batch, lent to the caller until dropped; dropping it hands the buffer back to the
/// loader to fill again.
pub struct Staged<'a, B: Send + 'static> {
    guard: Option<MutexGuard<'a, Staging<B>>>,
    shared: &'a Shared<B>,
    index: usize,
    /// Which batch this is, and the position to save after its step.
    pub info: BatchInfo,
}

impl<B: Send + 'static> std::ops::Deref for Staged<'_, B> {
    type Target = Staging<B>;
    fn deref(&self) -> &Staging<B> {
        self.guard.as_ref().expect("held until drop")
    }
}

impl<B: Send + 'static> Staged<'_, B> {
    /// Which of the two buffers this is (0 or 1): the CUDA side keys its copy events by it.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl<B: Send + 'static> Drop for Staged<'_, B> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.shared.state().free.push(self.index);
        self.shared.changed.notify_all();
    }
}

impl<B: AsMut<[u8]> + Send + 'static> Loader<B> {
    /// Starts the loader thread on `epochs`, filling `buffers` in turn. Each buffer must hold
    /// at least the source's [`super::InputSlot::bytes`] for `x` and for `y`.
    pub fn spawn<S: BatchSource + 'static>(
        epochs: Epochs<S>,
        mut buffers: [Staging<B>; 2],
    ) -> Result<Loader<B>, DataError> {
        let (xb, yb) = (epochs.source().x().bytes(), epochs.source().y().bytes());
        for (i, b) in buffers.iter_mut().enumerate() {
            let (xl, yl) = (b.x.as_mut().len(), b.y.as_mut().len());
            if xl < xb || yl < yb {
                return Err(DataError::Stopped(format!(
                    "staging buffer {i} holds {xl} + {yl} bytes but a batch of {} needs {xb} + {yb}",
                    epochs.source().describe()
                )));
            }
        }
        let mut free = Ring::new();
        free.push(0);
        free.push(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                free,
                ready: Ring::new(),
                closed: false,
                exited: false,
            }),
            changed: Condvar::new(),
            buffers: buffers.map(Mutex::new),
        });
        let theirs = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("ingot-data".into())
            .spawn(move || {
                let _exit = Exit(&theirs);
                work(epochs, &theirs)
            })
            .map_err(|e| DataError::Stopped(format!("cannot start the loader thread: {e}")))?;
        Ok(Loader {
            shared: Some(shared),
            worker: Some(worker),
            finished: false,
        })
    }

    /// The next batch, waiting for the loader if it is not ready yet; `None` after the last
    /// epoch. Drop the [`Staged`] batch (after the step's copy of it) before asking again.
    pub fn next_batch(&mut self) -> Result<Option<Staged<'_, B>>, DataError> {
        if self.finished {
            return Ok(None);
        }
        let shared = self.shared.as_deref().expect("present until drop");
        let message = {
            let mut state = shared.state();
            loop {
                if let Some(m) = state.ready.pop() {
                    break m;
                }
                if state.exited {
                    break Err(DataError::Stopped(
                        "the loader thread stopped unexpectedly".into(),
                    ));
                }
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
        };
        match message {
            Ok(Some((index, info))) => Ok(Some(Staged {
                guard: Some(lock(&shared.buffers[index])),
                shared,
                index,
                info,
            })),
            Ok(None) => {
                self.finished = true;
                Ok(None)
            }
            Err(e) => {
                self.finished = true;
                Err(e)
            }
        }
    }

    /// Stops the thread and gives the buffers back (to be freed or reused by their owner).
    pub fn into_buffers(mut self) -> [Staging<B>; 2] {
        self.stop();
        let shared = self.shared.take().expect("present until drop");
        match Arc::try_unwrap(shared) {
            Ok(s) => s
                .buffers
                .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())),
            Err(_) => unreachable!("the worker, the only other owner, has been joined"),
        }
    }
}

impl<B: Send + 'static> Loader<B> {
    fn stop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.state().closed = true;
            shared.changed.notify_all();
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl<B: Send + 'static> Drop for Loader<B> {
    fn drop(&mut self) {
        self.stop();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks the worker as exited when it returns or unwinds, so the caller never waits forever.
struct Exit<'a, B>(&'a Shared<B>);

impl<B> Drop for Exit<'_, B> {
    fn drop(&mut self) {
        self.0.state().exited = true;
        self.0.changed.notify_all();
    }
}

/// The loader thread: fill each buffer handed back, in cursor order, until the end, an error,
/// or the loader is dropped.
fn work<S: BatchSource, B: AsMut<[u8]>>(mut epochs: Epochs<S>, shared: &Shared<B>) {
    loop {
        let index = {
            let mut state = shared.state();
            loop {
                if state.closed {
                    return;
                }
                if let Some(i) = state.free.pop() {
                    break i;
                }
                state = shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
        };
        let result = {
            let mut slot = lock(&shared.buffers[index]);
            let Staging { x, y } = &mut *slot;
            epochs.next_into(x.as_mut(), y.as_mut())
        };
        let (message, last) = match result {
            Ok(Some(info)) => (Ok(Some((index, info))), false),
            Ok(None) => (Ok(None), true),
            Err(e) => (Err(e), true),
        };
        shared.state().ready.push(message);
        shared.changed.notify_all();
        if last {
            return;
        }
    }
}
