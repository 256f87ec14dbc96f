//! `--report run.html`: one self-contained page (inline SVG, no script, no external file) with
//! the training and validation loss curves and the memory over the run, the planned figure
//! beside the measured one. Its curves are [`Curve`]s: every point of a run of up to
//! [`Curve::POINTS`] steps, evenly thinned beyond (the first and last always drawn).

use crate::figure::Figure;
use crate::record::Curve;

/// What a run recorded for its report.
#[derive(Clone, Debug, Default)]
pub struct RunRecord {
    pub model: String,
    pub device: String,
    pub dataset: Option<String>,
    /// (step, training loss), finite ones.
    pub losses: Curve<f64>,
    /// (step, validation loss).
    pub val: Curve<f64>,
    /// (step, (top-1, top-5) validation accuracy) of a classifier, counted in its evaluation
    /// step ([`ingot_compiler::trace::accuracy`]); empty for other models.
    pub val_top_k: Curve<(f64, f64)>,
    /// The one allocation: the training step's plan total, or with a validation step, the
    /// two steps' shared total.
    pub planned_bytes: usize,
    /// How the one allocation divides between the training and validation steps, where there
    /// is a validation step.
    pub eval_layout: Option<ingot_compiler::plan::shared::SharedLayout>,
    /// (step, memory the run holds, measured): on a GPU the allocation plus any change in free
    /// device memory since the first step; on the CPU, where the process counts its heap
    /// ([`crate::host_memory`]), the bytes loading the step took plus any growth of the heap
    /// since the first step; empty where nothing was measured.
    pub memory: Curve<usize>,
    /// The step's model FLOPs and the device's peak ([`crate::flop_rate`]), and the median
    /// step time: the page's FLOP rate row.
    pub flop_rate: Option<crate::flop_rate::FlopRate>,
    pub median_step_seconds: Option<f64>,
}

/// The FLOP rate row of `r`: the model FLOPs of a step, the rate of the median step and the
/// fraction of the device's peak (where it is known).
fn rate_row(r: &RunRecord) -> String {
    let Some(rate) = r.flop_rate else {
        return String::new();
    };
    let achieved = r
        .median_step_seconds
        .map(|s| rate.text(s, r.device == "cpu"))
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "-".into());
    format!(
        "<tr><td>model FLOPs per step</td><td>{:.4e}</td></tr>\
         <tr><td>FLOP rate (median step)</td><td>{}</td></tr>",
        rate.model_flops as f64,
        escape(&achieved)
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A curve: its name, its colour and its (x, y) points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// One line chart of `series` as inline SVG.
fn chart(title: &str, y_label: &str, series: &[Series<'_>]) -> String {
    let (w, h, l, r, t, b) = (720.0, 300.0, 70.0, 20.0, 30.0, 40.0);
    let pts = series.iter().flat_map(|s| s.2.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\">\
         <text x=\"{l}\" y=\"18\" font-weight=\"bold\">{}</text>",
        escape(title)
    );
    if x0 > x1 {
        out.push_str("<text x=\"70\" y=\"150\">no data</text></svg>");
        return out;
    }
    if x1 == x0 {
        x1 = x0 + 1.0;
    }
    if y1 == y0 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let pad = (y1 - y0) * 0.05;
    let (y0, y1) = (y0 - pad, y1 + pad);
    let sx = |x: f64| l + (x - x0) / (x1 - x0) * (w - l - r);
    let sy = |y: f64| t + (y1 - y) / (y1 - y0) * (h - t - b);
    out.push_str(&format!(
        "<rect x=\"{l}\" y=\"{t}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>",
        w - l - r,
        h - t - b
    ));
    for k in 0..=4 {
        let y = y0 + (y1 - y0) * k as f64 / 4.0;
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
            l - 4.0,
            sy(y) + 4.0,
            short(y)
        ));
    }
    out.push_str(&format!(
        "<text x=\"{l}\" y=\"{}\" font-size=\"11\">step {}</text><text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">step {}</text>\
         <text x=\"12\" y=\"{}\" font-size=\"11\" transform=\"rotate(-90 12 {})\">{}</text>",
        h - 22.0,
        x0,
        w - r,
        h - 22.0,
        x1,
        h / 2.0,
        h / 2.0,
        escape(y_label)
    ));
    for (i, (name, colour, points)) in series.iter().enumerate() {
        let path: Vec<String> = points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"{colour}\">{}</text>",
            path.join(" "),
            w - r - 200.0,
            t + 16.0 + 16.0 * i as f64,
            escape(name)
        ));
    }
    out.push_str("</svg>");
    out
}

fn short(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{:.3}", Figure(v))
    }
}

/// The page.
pub fn html(r: &RunRecord) -> String {
    let f = |v: &Curve<f64>| v.points().map(|(s, y)| (s as f64, y)).collect::<Vec<_>>();
    let mut loss_series = vec![("training loss", "#1f77b4", f(&r.losses))];
    if !r.val.is_empty() {
        loss_series.push(("validation loss", "#d62728", f(&r.val)));
    }
    let accuracy = if r.val_top_k.is_empty() {
        String::new()
    } else {
        let pct = |k: fn((f64, f64)) -> f64| {
            r.val_top_k
                .points()
                .map(|(s, a)| (s as f64, 100.0 * k(a)))
                .collect::<Vec<_>>()
        };
        let series = [
            ("top-1", "#9467bd", pct(|a| a.0)),
            ("top-5", "#8c564b", pct(|a| a.1)),
        ];
        format!(
            "<h2>Validation accuracy</h2>{}",
            chart("validation accuracy", "%", &series)
        )
    };
    let last_acc = r.val_top_k.last().map_or("-".into(), |(_, (a, b))| {
        format!("top-1 {:.2}%, top-5 {:.2}%", 100.0 * a, 100.0 * b)
    });
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    let (first, last) = (
        r.losses.first().map_or(0, |p| p.0),
        r.losses.last().map_or(0, |p| p.0),
    );
    let planned = vec![
        (first as f64, mib(r.planned_bytes)),
        (last as f64, mib(r.planned_bytes)),
    ];
    let mut mem_series = vec![("planned (one allocation)", "#2ca02c", planned)];
    let on_host = r.device.starts_with("cpu");
    if !r.memory.is_empty() {
        mem_series.push((
            if on_host {
                "measured on the host (heap)"
            } else {
                "measured on the device"
            },
            "#ff7f0e",
            r.memory.points().map(|(s, b)| (s as f64, mib(b))).collect(),
        ));
    }
    let memory_note = if r.memory.is_empty() {
        "On the CPU the step's one allocation is made once, of exactly the planned size; nothing is allocated per step (tests/zero_alloc.rs, tests/data_loader.rs count)."
            .to_string()
    } else if on_host {
        "Measured: the host bytes loading the step took (its one allocation, the threads' scratch and its program), counted by the process's allocator, plus any growth of the heap since the first step (flat when the steps hold no new memory).".to_string()
    } else {
        "Measured: the allocation as the driver sized it, plus any change in free device memory since the first step (flat when the steps allocate nothing).".to_string()
    };
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>ingot run: {model}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:760px}}td{{padding:2px 12px 2px 0}}</style></head><body>\
         <h1>ingot run: {model}</h1><table>\
         <tr><td>device</td><td>{device}</td></tr>\
         <tr><td>data set</td><td>{dataset}</td></tr>\
         <tr><td>steps</td><td>{steps}</td></tr>\
         <tr><td>last loss</td><td>{last_loss}</td></tr>\
         <tr><td>last validation loss</td><td>{last_val}</td></tr>\
         <tr><td>last validation accuracy</td><td>{last_acc}</td></tr>\
         <tr><td>planned memory</td><td>{planned:.1} MiB{eval}</td></tr>{rate}</table>\
         <h2>Loss</h2>{loss}{accuracy}<h2>Memory</h2>{mem}<p>{memory_note}</p></body></html>\n",
        model = escape(&r.model),
        device = escape(&r.device),
        dataset = escape(r.dataset.as_deref().unwrap_or("one fixed batch")),
        steps = r.losses.count(),
        last_loss = r
            .losses
            .last()
            .map_or("-".into(), |p| format!("{:.6}", Figure(p.1))),
        last_val = r
            .val
            .last()
            .map_or("-".into(), |p| format!("{:.6}", Figure(p.1))),
        planned = mib(r.planned_bytes),
        eval = r
            .eval_layout
            .map(|l| format!(
                ", one allocation for the training and validation steps: {:.1} MiB resident + max({:.1} MiB training slab, {:.1} MiB validation slab) + {:.1} MiB validation inputs ({:.1} MiB as two allocations)",
                mib(l.slab_base),
                mib(l.train_slab_bytes),
                mib(l.eval_slab_bytes),
                mib(l.eval_only_bytes),
                mib(l.separate_bytes()),
            ))
            .unwrap_or_default(),
        rate = rate_row(r),
        loss = chart("loss per step", "loss", &loss_series),
        mem = chart(
            if on_host {
                "host memory held by the run"
            } else {
                "device memory held by the run"
            },
            "MiB",
            &mem_series
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_is_one_page_with_both_curves_and_no_external_reference() {
        let r = RunRecord {
            model: "gpt:<x>".into(),
            device: "cpu".into(),
            dataset: Some("tokens a.bin".into()),
            losses: (1..=10).map(|i| (i, 5.0 - i as f64 * 0.1)).collect(),
            val: [(5, 4.8), (10, 4.3)].into_iter().collect(),
            val_top_k: Curve::new(),
            planned_bytes: 3 << 20,
            eval_layout: Some(ingot_compiler::plan::shared::SharedLayout {
                resident_bytes: 1 << 20,
                shared_parameter_bytes: 1 << 20,
                slab_base: 1 << 20,
                train_slab_bytes: 2 << 20,
                eval_slab_bytes: 1 << 20,
                eval_only_bytes: 0,
                train_total_bytes: 3 << 20,
                eval_alone_bytes: 2 << 20,
                total_bytes: 3 << 20,
            }),
            memory: Curve::new(),
            flop_rate: Some(crate::flop_rate::FlopRate {
                model_flops: 3_000_000_000,
                peak_tflops: None,
            }),
            median_step_seconds: Some(0.5),
        };
        let page = html(&r);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert_eq!(page.matches("<polyline").count(), 3, "train, val, planned");
        assert!(
            page.contains("gpt:&lt;x&gt;"),
            "the model's name is escaped"
        );
        assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("href="));
        assert!(
            page.contains("3.0 MiB")
                && page.contains("max(2.0 MiB training slab, 1.0 MiB validation slab)")
        );
        assert!(
            !page.contains("Validation accuracy"),
            "no classifier counts, no chart"
        );
        assert!(
            page.contains("<td>model FLOPs per step</td><td>3.0000e9</td>")
                && page.contains("<td>FLOP rate (median step)</td><td>6.00 GFLOP/s</td>"),
            "the CPU's rate, without a fraction: {page}"
        );
    }

    #[test]
    fn a_gpu_s_report_gives_its_rate_as_a_fraction_of_the_device_s_peak() {
        let r = RunRecord {
            device: "cuda:0 NVIDIA H200".into(),
            flop_rate: Some(crate::flop_rate::FlopRate::new(
                8_500_000_000_000,
                "cuda:0 NVIDIA H200",
                ingot_compiler::precision::Precision::Bf16,
                None,
            )),
            median_step_seconds: Some(0.02),
            ..Default::default()
        };
        let page = html(&r);
        assert!(
            page.contains("425.0 TFLOP/s (43.0% of 989.4 peak)"),
            "{page}"
        );
    }

    #[test]
    fn a_classifier_s_report_shows_its_last_top_1_and_top_5_accuracy_and_their_curves() {
        let r = RunRecord {
            losses: (1..=4).map(|i| (i, 2.0)).collect(),
            val: [(2, 1.5), (4, 1.2)].into_iter().collect(),
            val_top_k: [(2, (0.25, 0.5)), (4, (0.375, 0.875))]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let page = html(&r);
        assert!(page.contains("top-1 37.50%, top-5 87.50%"), "{page}");
        assert!(page.contains("Validation accuracy"));
        assert_eq!(
            page.matches("<polyline").count(),
            5,
            "train, val, top-1, top-5, planned"
        );
    }
}
