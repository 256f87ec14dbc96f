//! The step's FLOP rate: the model FLOPs of one step ([`ingot_compiler::flops::model`]: the
//! forward and backward products, recomputation left out) over its time, and the fraction of
//! the device's peak that is (model FLOPs utilisation, MFU), for the progress line, `--json` and
//! the run report.
//!
//! The peak is the device's dense arithmetic rate at the step's precision, from [`PEAKS`] (a
//! GPU the table names), or the one the user gives (`--peak-tflops`). A device the table does
//! not name gets no fraction: a made-up peak would make a made-up fraction. The CPU is not in
//! the table (its peak depends on the cores, clocks and vector units a run gets), so a CPU run
//! shows its rate alone unless a peak is given.

use ingot_compiler::precision::Precision;

/// One GPU's dense peak rates, in TFLOP/s, at each precision a step runs in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakRow {
    /// What the row is, as documented.
    pub gpu: &'static str,
    /// The CUDA device name contains every one of these...
    pub all_of: &'static [&'static str],
    /// ...and none of these (the PCIe and NVL boards of the same chip run at lower clocks
    /// and power, with other peaks).
    pub none_of: &'static [&'static str],
    /// Strict f32 (no tensor cores), TF32 tensor cores, bf16 tensor cores (f32 accumulation).
    pub f32: f64,
    pub tf32: f64,
    pub bf16: f64,
}

impl PeakRow {
    /// This row's rate at `precision`.
    pub fn at(&self, precision: Precision) -> f64 {
        match precision {
            Precision::F32 => self.f32,
            Precision::Tf32 => self.tf32,
            Precision::Bf16 => self.bf16,
        }
    }

    fn matches(&self, device: &str) -> bool {
        self.all_of.iter().all(|s| device.contains(s))
            && !self.none_of.iter().any(|s| device.contains(s))
    }
}

/// Dense (no structured sparsity) peak rates, as NVIDIA publishes them:
/// - H100 SXM5: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), table 3 "NVIDIA
///   H100 SXM5": FP32 66.9, TF32 tensor 494.7, BF16 tensor 989.4 TFLOP/s (the datasheet's 989
///   and 1,979 for TF32 and BF16 are with sparsity, twice the dense rates). The CUDA name of the
///   SXM board is `NVIDIA H100 80GB HBM3`.
/// - H200 (SXM): the H200 datasheet (2024) gives the H100 SXM5's figures (FP32 67, TF32 989*,
///   BF16 1,979*, * with sparsity): the same tensor cores at the same clocks, so the
///   whitepaper's dense figures above. CUDA name `NVIDIA H200`; the H200 NVL is not this row.
/// - A100 (SXM4 and PCIe alike): NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020),
///   table 1, and the A100 datasheet: FP32 19.5, TF32 tensor 156, BF16 tensor 312 TFLOP/s.
pub const PEAKS: [PeakRow; 3] = [
    PeakRow {
        gpu: "NVIDIA H200 (SXM)",
        all_of: &["H200"],
        none_of: &["NVL"],
        f32: 66.9,
        tf32: 494.7,
        bf16: 989.4,
    },
    PeakRow {
        gpu: "NVIDIA H100 SXM5",
        all_of: &["H100"],
        none_of: &["PCIe", "NVL"],
        f32: 66.9,
        tf32: 494.7,
        bf16: 989.4,
    },
    PeakRow {
        gpu: "NVIDIA A100",
        all_of: &["A100"],
        none_of: &[],
        f32: 19.5,
        tf32: 156.0,
        bf16: 312.0,
    },
];

/// The table's dense peak of the device named `device` (the CUDA device name, or the run's
/// device string `cuda:0 NVIDIA H200`) at `precision`, in TFLOP/s; `None` for a device the
/// table does not name (the CPU among them).
pub fn table_peak(device: &str, precision: Precision) -> Option<f64> {
    if device == "cpu" || device.starts_with("cpu ") {
        return None;
    }
    PEAKS
        .iter()
        .find(|r| r.matches(device))
        .map(|r| r.at(precision))
}

/// A run's FLOP rate: its step's model FLOPs and the peak they are held against.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlopRate {
    /// Model FLOPs of one step, on one rank ([`ingot_compiler::flops::model`]).
    pub model_flops: u64,
    /// The peak, TFLOP/s of one device: the one given, else the table's; `None` when neither.
    pub peak_tflops: Option<f64>,
}

impl FlopRate {
    /// The rate of a step of `model_flops` on `device` at `precision`, held against `given`
    /// (`--peak-tflops`) or else the table's peak.
    pub fn new(
        model_flops: u64,
        device: &str,
        precision: Precision,
        given: Option<f64>,
    ) -> FlopRate {
        FlopRate {
            model_flops,
            peak_tflops: given.or_else(|| table_peak(device, precision)),
        }
    }

    /// TFLOP/s achieved by a step of `seconds`; `None` for a step of no time (or no FLOPs).
    pub fn tflops(&self, seconds: f64) -> Option<f64> {
        (seconds > 0.0 && self.model_flops > 0).then(|| self.model_flops as f64 / seconds / 1e12)
    }

    /// The fraction of the peak a step of `seconds` achieves; `None` without a peak.
    pub fn fraction(&self, seconds: f64) -> Option<f64> {
        self.tflops(seconds)
            .zip(self.peak_tflops)
            .map(|(t, p)| t / p)
    }

    /// `171.3 TFLOP/s (17.3% of 989.4)` on a GPU, `3.21 GFLOP/s` on the CPU (`gflops`): the
    /// rate of a step of `seconds` as the progress line and the summary print it; empty when
    /// there is none.
    pub fn text(&self, seconds: f64, gflops: bool) -> String {
        let Some(t) = self.tflops(seconds) else {
            return String::new();
        };
        let rate = if gflops {
            format!("{:.2} GFLOP/s", t * 1e3)
        } else {
            format!("{t:.1} TFLOP/s")
        };
        match (self.fraction(seconds), self.peak_tflops) {
            (Some(f), Some(p)) => format!("{rate} ({:.1}% of {p} peak)", 100.0 * f),
            _ => rate,
        }
    }
}

/// A peak given on the command line must be a positive, finite rate.
pub fn check_given(peak: Option<f64>) -> Result<(), String> {
    match peak {
        Some(p) if !(p.is_finite() && p > 0.0) => Err(format!(
            "--peak-tflops {p}: give the device's peak as a positive number of TFLOP/s (989.4 for an H100 SXM's dense bf16)"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_the_h200_h100_sxm_and_a100_by_their_cuda_names_at_each_precision() {
        let h200 = "cuda:0 NVIDIA H200";
        assert_eq!(table_peak(h200, Precision::Bf16), Some(989.4));
        assert_eq!(table_peak(h200, Precision::Tf32), Some(494.7));
        assert_eq!(table_peak(h200, Precision::F32), Some(66.9));
        let h100 = "NVIDIA H100 80GB HBM3";
        assert_eq!(table_peak(h100, Precision::Bf16), Some(989.4));
        assert_eq!(table_peak(h100, Precision::Tf32), Some(494.7));
        for a100 in ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB"] {
            assert_eq!(table_peak(a100, Precision::Bf16), Some(312.0), "{a100}");
            assert_eq!(table_peak(a100, Precision::Tf32), Some(156.0), "{a100}");
        }
    }

    #[test]
    fn a_device_the_table_does_not_name_has_no_peak_and_so_no_fraction() {
        for device in [
            "cpu",
            "cuda:0 NVIDIA H100 PCIe",
            "cuda:0 NVIDIA H200 NVL",
            "cuda:0 NVIDIA GeForce RTX 4090",
            "cuda:0 unknown GPU",
        ] {
            assert_eq!(table_peak(device, Precision::Bf16), None, "{device}");
            let r = FlopRate::new(2_000_000_000_000, device, Precision::Bf16, None);
            assert_eq!(r.tflops(0.5), Some(4.0));
            assert_eq!(r.fraction(0.5), None, "{device}");
            assert_eq!(r.text(0.5, false), "4.0 TFLOP/s");
        }
    }

    #[test]
    fn a_given_peak_overrides_the_table_and_gives_a_fraction_anywhere() {
        let r = FlopRate::new(
            500_000_000_000_000,
            "cuda:0 NVIDIA H200",
            Precision::Bf16,
            Some(800.0),
        );
        assert_eq!(r.peak_tflops, Some(800.0));
        assert_eq!(r.tflops(1.0), Some(500.0));
        assert_eq!(r.fraction(1.0), Some(0.625));
        assert_eq!(r.text(1.0, false), "500.0 TFLOP/s (62.5% of 800 peak)");
        let cpu = FlopRate::new(3_000_000_000, "cpu", Precision::F32, Some(1.5));
        assert_eq!(cpu.text(1.0, true), "3.00 GFLOP/s (0.2% of 1.5 peak)");
        assert!(check_given(Some(0.0)).is_err());
        assert!(check_given(Some(f64::NAN)).is_err());
        assert!(check_given(Some(-1.0)).is_err());
        assert!(check_given(Some(989.4)).is_ok() && check_given(None).is_ok());
    }

    #[test]
    fn a_step_of_no_time_has_no_rate() {
        let r = FlopRate::new(10, "cpu", Precision::F32, None);
        assert_eq!(r.tflops(0.0), None);
        assert_eq!(r.text(0.0, true), "");
    }
}
