//! Finding where a step's time goes: each operation run alone and timed ([`CudaStep::profile`]),
//! and the step's graph captured with a timestamp after each operation
//! ([`CudaStep::timeline`], [`super::crate::cuda::timeline`]).

use super::errors::driver;
use super::stamps::Stamps;
use super::CudaStep;
use crate::error::ExecError;
use cudarc::driver::{result, sys};

impl CudaStep {
    /// Runs the step's operations one by one, outside the graph, with an event after each, and
    /// returns each operation's device time in milliseconds (in program order). For finding
    /// where a step's time goes; the leaves' values change as in a step.
    pub fn profile(&mut self) -> Result<Vec<f32>, ExecError> {
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        let part = &self.main;
        let events = (0..=part.program.ops.len())
            .map(|_| {
                self.ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("creating an event"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        events[0]
            .record(&self.stream)
            .map_err(driver("recording an event"))?;
        for (op, e) in part.program.ops.iter().zip(&events[1..]) {
            self.enqueue(part, op)?;
            e.record(&self.stream)
                .map_err(driver("recording an event"))?;
        }
        self.stream
            .synchronize()
            .map_err(driver("running the step"))?;
        events
            .windows(2)
            .map(|w| w[0].elapsed_ms(&w[1]).map_err(driver("timing")))
            .collect()
    }

    /// Replays the training step `replays` times as a graph captured with a timestamp after
    /// each operation ([`crate::cuda::timeline`]) and returns the last replay's stamps in nanoseconds:
    /// the graph's start, then each operation's end, in program order. The stamps' buffer is a
    /// diagnostic's allocation outside the plan, freed before returning; the leaves' values
    /// change as in a step.
    pub fn timeline(&mut self, replays: usize) -> Result<Vec<u64>, ExecError> {
        self.ctx.bind_to_thread().map_err(driver("binding"))?;
        let slots = self.main.program.ops.len() + 1;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(
                crate::cuda::timeline::STAMP_PTX,
            ))
            .map_err(driver("loading the stamp kernel"))?;
        let function = module
            .load_function(crate::cuda::timeline::STAMP_KERNEL)
            .map_err(driver("finding the stamp kernel"))?;
        let (_, highest) =
            result::stream::get_priority_range().map_err(driver("reading stream priorities"))?;
        let stream = self
            .ctx
            .new_stream_with_priority(highest)
            .map_err(driver("creating the stamps' stream"))?;
        // SAFETY: a fresh allocation of `slots` u64s, freed below on every path.
        let base = unsafe { result::malloc_sync(slots * 8) }
            .map_err(driver("allocating the timeline's stamps"))?;
        let stamps = Stamps {
            stream,
            function,
            base,
        };
        let run = || -> Result<Vec<u64>, ExecError> {
            let graph = self.capture(&self.main, Some(&stamps))?;
            for _ in 0..replays.max(1) {
                graph
                    .launch()
                    .map_err(driver("launching the timeline's graph"))?;
            }
            self.stream
                .synchronize()
                .map_err(driver("running the timeline's graph"))?;
            let mut out = vec![0u64; slots];
            // SAFETY: `base` holds `slots` u64s; the stream that wrote them has finished.
            unsafe { result::memcpy_dtoh_sync(&mut out, base) }
                .map_err(driver("reading the timeline's stamps"))?;
            Ok(out)
        };
        let out = run();
        // SAFETY: allocated above; the graph that wrote it is dropped and the stream idle.
        let freed = unsafe { result::free_sync(base) }.map_err(driver("freeing the stamps"));
        let out = out?;
        freed?;
        Ok(out)
    }
}
