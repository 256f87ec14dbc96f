//! How `ingot train` and `ingot run` show a run: the [`Observer`] of
//! [`ingot_trainer::run::train`] that prints a line (of text or JSON) per step, evaluation and
//! epoch, the run's header and summary, and on a terminal a progress bar.

use crate::failure::Failure;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ingot_compiler::report::human;
use ingot_trainer::figure::Figure;
use ingot_trainer::run::{
    EpochEvent, EvalEvent, Finished, Note, Observer, ObserverError, Start, StepEvent, Summary,
    Weights,
};
use ingot_trainer::session;
use std::io::IsTerminal;

/// One line of `--json` output, fields in this order.
#[derive(serde::Serialize)]
struct StepLine {
    /// The epoch of the step's batch (data set runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    step: u64,
    loss: f64,
    /// The step's device time on a GPU, its wall-clock time on the CPU.
    seconds: f64,
    /// The wall clock of the step and the loss's copy to the host.
    wall_seconds: f64,
    /// Step to step: the wall clock from the end of the previous step's loop iteration to the
    /// end of this one (data waits, staging, the step, the loss's copy, this line's printing):
    /// what a run's throughput is made of, on a fixed batch and over a data set alike.
    interval_seconds: f64,
    /// Tokens (of a token stream) trained on per second of wall clock, data waits included.
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens_per_s: Option<f64>,
    /// Samples (of a sample set) trained on per second of wall clock, data waits included.
    #[serde(skip_serializing_if = "Option::is_none")]
    samples_per_s: Option<f64>,
    /// The factor the schedule scaled the learning rate by (scheduled runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    lr_scale: Option<f64>,
    /// The gradients' global norm before clipping (with --clip-grad-norm).
    #[serde(skip_serializing_if = "Option::is_none")]
    grad_norm: Option<f64>,
    /// The step's model FLOPs over `seconds`, in TFLOP/s (of one GPU, with several).
    #[serde(skip_serializing_if = "Option::is_none")]
    tflops: Option<f64>,
    /// `tflops` as a fraction of the device's dense peak, where the peak is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_fraction: Option<f64>,
    /// Present (and true) only on a step whose loss is NaN or infinite: `loss` alone would
    /// print as `null` for both.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    non_finite: bool,
}

/// The `--json` line of an evaluation.
#[derive(serde::Serialize)]
struct EvalLine {
    /// The step after which the evaluation ran.
    eval_step: u64,
    val_loss: f64,
    /// A classifier's top-1 and top-5 accuracy (fractions), counted in the evaluation step.
    #[serde(skip_serializing_if = "Option::is_none")]
    val_top1: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    val_top5: Option<f64>,
}

/// The `--json` line at the end of each epoch of a data set run.
#[derive(serde::Serialize)]
struct EpochLine {
    epoch_end: u64,
    /// The step that finished it.
    step: u64,
    mean_loss: f64,
    /// GPU only: free device memory now (flat from epoch to epoch when nothing allocates).
    #[serde(skip_serializing_if = "Option::is_none")]
    free_device_bytes: Option<usize>,
}

/// A printing failure carried through the run ([`ingot_trainer::run::RunError::Observer`])
/// back to the command line with its exit code.
#[derive(Debug)]
pub struct Printing(pub Failure);

impl std::fmt::Display for Printing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for Printing {}

fn printing(f: Failure) -> ObserverError {
    Box::new(Printing(f))
}

/// Prints a run: text lines (with a progress bar on a terminal) or JSON lines.
pub struct Printer {
    json: bool,
    bar: Option<ProgressBar>,
    /// The planned total, as the progress bar shows it.
    planned: String,
    /// The last validation loss, as the progress bar shows it.
    val_loss: Option<f64>,
    /// The last validation top-1 accuracy of a classifier, as the progress bar shows it.
    val_top1: Option<f64>,
    /// The step's FLOP rate, as the step lines show it, and whether in GFLOP/s (the CPU).
    rate: Option<(ingot_trainer::flop_rate::FlopRate, bool)>,
}

impl Printer {
    pub fn new(json: bool) -> Printer {
        Printer {
            json,
            bar: None,
            planned: String::new(),
            val_loss: None,
            val_top1: None,
            rate: None,
        }
    }

    /// A line below the progress bar, or on stdout.
    fn line(&self, text: String) -> Result<(), ObserverError> {
        match &self.bar {
            Some(bar) => {
                bar.println(crate::output::printable(&text));
                Ok(())
            }
            None => outln!("{text}").map_err(printing),
        }
    }
}

fn json(v: &impl serde::Serialize) -> Result<String, ObserverError> {
    serde_json::to_string(v).map_err(|e| printing(Failure::new(1, e.to_string())))
}

impl Observer for Printer {
    fn start(&mut self, s: &Start) -> Result<(), ObserverError> {
        self.planned = human(s.planned_bytes);
        self.rate = Some((s.flop_rate, s.device == session::Device::Cpu));
        if !self.json {
            header(s).map_err(printing)?;
        }
        if let Some(text) = &s.dropped {
            if self.json {
                errln!("ingot: {text}");
            } else {
                outln!("{text}").map_err(printing)?;
            }
        }
        // On a terminal (and without --json), a progress bar on stdout below the step lines;
        // otherwise the lines alone, unchanged.
        self.bar = (!self.json && std::io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(s.last, ProgressDrawTarget::stdout());
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} step {pos}/{len}  {msg}  [{elapsed_precise}, ETA {eta}]",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_position(s.first);
            bar.reset_eta();
            bar
        });
        Ok(())
    }

    fn step(&mut self, e: &StepEvent) -> Result<(), ObserverError> {
        let r = e.result;
        let i = e.step;
        if self.json {
            let line = StepLine {
                epoch: e.epoch,
                step: i,
                loss: r.loss,
                seconds: r.seconds,
                wall_seconds: r.wall_seconds,
                interval_seconds: e.interval_seconds,
                tokens_per_s: e.rate.filter(|r| r.0 == "tokens").map(|r| r.1),
                samples_per_s: e.rate.filter(|r| r.0 == "samples").map(|r| r.1),
                lr_scale: e.lr_scale,
                grad_norm: e.grad_norm,
                tflops: e.tflops,
                peak_fraction: e.peak_fraction,
                non_finite: !e.finite,
            };
            return outln!("{}", json(&line)?).map_err(printing);
        }
        let ep = e
            .epoch
            .map(|e| format!("epoch {e:>3}  "))
            .unwrap_or_default();
        let extra = e
            .grad_norm
            .map(|n| format!("  grad norm {n:>10.4}"))
            .unwrap_or_default()
            + &e.lr_scale
                .map(|f| format!("  lr x{f:.4}"))
                .unwrap_or_default();
        let rate = self
            .rate
            .map(|(rate, cpu)| rate.text(r.seconds, cpu))
            .filter(|t| !t.is_empty())
            .map(|t| format!("  {t}"))
            .unwrap_or_default();
        let text = format!(
            "{ep}step {i:>5}  loss {:>12.6}  {:>9.3} ms{rate}{extra}",
            Figure(r.loss),
            r.seconds * 1e3
        );
        let Some(bar) = &self.bar else {
            return outln!("{text}").map_err(printing);
        };
        bar.println(crate::output::printable(&text));
        let speed = e
            .rate
            .map(|(unit, v)| format!("  {v:.0} {unit}/s"))
            .unwrap_or_default();
        let val = self
            .val_loss
            .map(|v| format!("  val {:.4}", Figure(v)))
            .unwrap_or_default();
        let val = match self.val_top1 {
            Some(a) => format!("{val} top-1 {:.1}%", 100.0 * a),
            None => val,
        };
        bar.set_message(format!(
            "{ep}loss {:.6}{val}{speed}  {:.3} ms/step{rate}  memory {}",
            Figure(r.loss),
            r.seconds * 1e3,
            self.planned
        ));
        bar.set_position(i);
        Ok(())
    }

    fn eval(&mut self, e: &EvalEvent) -> Result<(), ObserverError> {
        self.val_loss = Some(e.val_loss);
        self.val_top1 = e.top1;
        if self.json {
            let line = EvalLine {
                eval_step: e.step,
                val_loss: e.val_loss,
                val_top1: e.top1,
                val_top5: e.top5,
            };
            return outln!("{}", json(&line)?).map_err(printing);
        }
        let accuracy = match (e.top1, e.top5) {
            (Some(a), Some(b)) => format!(", top-1 {:.2}%, top-5 {:.2}%", 100.0 * a, 100.0 * b),
            _ => String::new(),
        };
        self.line(format!(
            "eval after step {}: val loss {:.6}{accuracy} over {} batches",
            e.step,
            Figure(e.val_loss),
            e.batches
        ))
    }

    fn epoch(&mut self, e: &EpochEvent) -> Result<(), ObserverError> {
        if self.json {
            let line = EpochLine {
                epoch_end: e.epoch,
                step: e.step,
                mean_loss: e.mean_loss,
                free_device_bytes: e.free_device_bytes,
            };
            return outln!("{}", json(&line)?).map_err(printing);
        }
        self.line(format!(
            "epoch {} done at step {}: mean loss {:.6}{}",
            e.epoch,
            e.step,
            Figure(e.mean_loss),
            e.free_device_bytes
                .map(|f| format!(", free device memory {f} bytes"))
                .unwrap_or_default()
        ))
    }

    fn note(&mut self, note: &Note) -> Result<(), ObserverError> {
        match note {
            Note::Resume(text) => errln!("ingot: {text}"),
            Note::Skipped(text) => match &self.bar {
                Some(bar) => bar.println(crate::output::printable(text)),
                None => errln!("ingot: {text}"),
            },
            Note::Saved(text) if !self.json => outln!("{text}").map_err(printing)?,
            Note::Saved(_) => {}
            Note::Ignored(text) if !self.json => outln!("{text}").map_err(printing)?,
            Note::Ignored(_) => {}
            Note::Tied(text) if !self.json => outln!("{text}").map_err(printing)?,
            Note::Tied(_) => {}
            Note::Names(text) if !self.json => outln!("{text}").map_err(printing)?,
            Note::Names(_) => {}
            Note::Data(text) => match &self.bar {
                Some(bar) => bar.println(crate::output::printable(&format!("warning: {text}"))),
                None => errln!("ingot: warning: {text}"),
            },
        }
        Ok(())
    }

    fn finish(&mut self, f: &Finished) -> Result<(), ObserverError> {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        summary(f, self.json).map_err(printing)
    }
}

/// The run's first line: the model, its size, the run's length, where and how it trains.
fn header(s: &Start) -> Result<(), Failure> {
    use ingot_compiler::precision::Precision;
    outln!(
        "model {}: {} parameters, {} on {}{}, {} parameters, {}",
        s.model,
        s.parameters,
        match (s.last, s.epochs) {
            (_, Some(e)) => format!("{e} epochs ({} steps)", s.last.unwrap_or(0)),
            (Some(n), None) => format!("{n} steps"),
            (None, None) => "? steps".into(),
        },
        s.device_name,
        match (s.device, s.precision) {
            (_, Precision::Bf16) => " (bf16 mixed precision)",
            (session::Device::Cuda(_), Precision::Tf32) => " (tf32 matmuls)",
            (session::Device::Cuda(_), _) => " (strict f32)",
            (session::Device::Cpu, _) => "",
        },
        match s.weights {
            Weights::Resumed => "resumed",
            Weights::Loaded => "loaded",
            Weights::FromFile => "the model file's",
            Weights::Seeded => "seeded",
        },
        match &s.dataset {
            Some((d, p)) => format!("{d}, {p} batches an epoch"),
            None if s.loaded_batch => "loaded batch".into(),
            None => "synthetic batch".into(),
        },
    )?;
    if let Some((step, epoch, dir)) = &s.resumed {
        outln!(
            "resuming after step {step} (epoch {epoch}) from {}",
            dir.display()
        )?;
    }
    Ok(())
}

/// The summary: one `{"summary": ..}` line, or the median step time and the memory, planned
/// and measured, as text.
fn summary(f: &Finished, json: bool) -> Result<(), Failure> {
    let s: &Summary = &f.summary;
    if json {
        #[derive(serde::Serialize)]
        struct Line<'a> {
            summary: &'a Summary,
        }
        let line = serde_json::to_string(&Line { summary: s })
            .map_err(|e| Failure::new(1, e.to_string()))?;
        return outln!("{line}");
    }
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    if let (Some(m), Some(w)) = (s.median_step_seconds, s.median_wall_seconds) {
        outln!(
            "median step {:.3} ms over {} ({:.3} ms wall clock, with launch and the loss's copy)",
            m * 1e3,
            match s.median_of_last {
                None => format!("{} steps", s.steps),
                Some(n) => format!("the last {n} of {} steps", s.steps),
            },
            w * 1e3
        )?;
    }
    let fraction = match (s.peak_fraction, s.peak_tflops) {
        (Some(f), Some(p)) => format!(", {:.1}% of the device's {p} TFLOP/s peak", 100.0 * f),
        _ => String::new(),
    };
    match (s.threads, s.gflops, s.tflops) {
        (Some(n), Some(g), _) => outln!(
            "cpu: {n} thread{}, {g:.1} GFLOP/s{fraction} (the step's {:.3e} model FLOPs, forward and backward products, over the median step)",
            if n == 1 { "" } else { "s" },
            s.model_flops as f64
        )?,
        (Some(n), None, _) => outln!("cpu: {n} thread{}", if n == 1 { "" } else { "s" })?,
        (None, _, Some(t)) => outln!(
            "FLOP rate: {t:.1} TFLOP/s{fraction}{} (the step's {:.3e} model FLOPs, forward and backward products, over the median step)",
            if f.data_ranks > 1 { ", per GPU" } else { "" },
            s.model_flops as f64
        )?,
        _ => {}
    }
    match s.eval {
        None => outln!(
            "memory planned: {:.1} MiB ({:.1} MiB resident + {:.1} MiB slab), one allocation{}",
            mib(s.planned_bytes),
            mib(s.resident_bytes),
            mib(s.slab_bytes),
            match f.data_ranks {
                1 => String::new(),
                n => format!(" per rank, on each of {n} ranks"),
            }
        )?,
        Some(l) => outln!(
            "memory planned: {:.1} MiB, one allocation; {}",
            mib(s.planned_bytes),
            ingot_trainer::eval::layout_line(&l)
        )?,
    }
    if let Some(b) = s.staging_bytes {
        outln!(
            "data staging: {:.2} MiB of host memory{} in two buffers, allocated once",
            mib(b),
            if s.context_bytes.is_some() {
                " (page-locked)"
            } else {
                ""
            }
        )?;
    }
    if let Some(n) = s.skipped_images {
        outln!(
            "images skipped as unreadable: {n}{}",
            if n > 0 {
                " (each named in a warning on stderr)"
            } else {
                ""
            }
        )?;
    }
    if let (Some(allocation), Some(requested), Some(context), Some(graph)) = (
        s.measured_bytes,
        f.requested_bytes,
        s.context_bytes,
        s.graph_bytes,
    ) {
        outln!(
            "memory measured on the GPU: {:.1} MiB taken by the allocation (asked {:.1} MiB; the driver rounds up to its page)",
            mib(allocation),
            mib(requested)
        )?;
        outln!(
            "CUDA context, cuBLAS and kernels (not the step's): {:.1} MiB; step graph: {:.1} MiB",
            mib(context),
            mib(graph)
        )?;
    }
    if let (Some(loaded), None) = (s.measured_bytes, s.context_bytes) {
        outln!(
            "memory measured on the host: {:.1} MiB taken by loading the step (its one allocation and its program)",
            mib(loaded)
        )?;
    }
    free_change(s)
}

/// Whether free device memory changed between the first step and the last.
fn free_change(s: &Summary) -> Result<(), Failure> {
    let said = |d: &[i64]| {
        if d.iter().all(|&d| d == 0) {
            "identical (no allocation during the steps)".to_string()
        } else if d.len() == 1 {
            format!("changed by {} bytes", d[0])
        } else {
            format!("changed by {d:?} bytes")
        }
    };
    if let Some(c) = &s.ranks_free_change_bytes {
        outln!(
            "free device memory after step 1 and after step {}, on each of {} GPUs: {}",
            s.steps,
            c.len(),
            said(c)
        )?;
    } else if let Some(d) = s.free_change_bytes {
        outln!(
            "free device memory after step 1 and after step {}: {}",
            s.steps,
            said(&[d])
        )?;
    } else if let Some(d) = s.heap_change_bytes {
        outln!(
            "host heap after step 1 and after step {}: {}",
            s.steps,
            match d {
                0 => "identical (the steps held no new memory)".to_string(),
                d => format!("changed by {d} bytes"),
            }
        )?;
    }
    Ok(())
}
