//! One image from file to a row of the model's input: decoded, cropped and resized to the
//! model's `H x W`, flipped, and normalised, as torchvision's transforms do it.
//!
//! - Training ([`Transform::Train`]): `RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3))`
//!   with torchvision's algorithm (10 attempts at a random area and aspect ratio, then a
//!   center crop of the whole image clamped to the ratio range), then `RandomHorizontalFlip`.
//! - Evaluation ([`Transform::Eval`]): `Resize(round(side / 0.875))` of the shorter side (the
//!   longer one scaled with it and truncated, as torchvision computes it), then `CenterCrop`.
//!
//! Resizing is Pillow's bilinear convolution (antialiased when shrinking, what torchvision's
//! PIL path does) by the `fast_image_resize` crate; the crop and the resize are one pass (the
//! crop is the resize's source box). Pixels are then `(v / 255 - mean) / std` in the input's
//! float type, written channel-major (NCHW).

use crate::data::error::DataError;
use fast_image_resize::{images::Image, FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{ColorType, DynamicImage};
use ingot_compiler::ir::DType;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Uniform};
use std::path::Path;

/// Which transform an image goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transform {
    /// Random resized crop and random horizontal flip.
    Train,
    /// Resize of the shorter side to `side / 0.875` and center crop.
    Eval,
}

/// A region of the source image, in pixels (fractional for the evaluation crop expressed in
/// source coordinates).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Region {
    pub left: f64,
    pub top: f64,
    pub width: f64,
    pub height: f64,
}

/// Why an image was not used: it cannot be read or decoded (skipped, another takes its place),
/// or it cannot feed the model (an error that stops the run).
#[derive(Debug)]
pub enum Failed {
    Skip(String),
    Fatal(DataError),
}

/// `RandomResizedCrop.get_params` for a `width x height` image, drawing from `rng`: integer
/// pixels, as torchvision's.
pub fn random_resized_crop(width: u32, height: u32, rng: &mut ChaCha8Rng) -> Region {
    let (w0, h0) = (width as f64, height as f64);
    let area = w0 * h0;
    let (lo, hi) = ((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln());
    let scale = Uniform::new(0.08, 1.0).expect("0.08 < 1");
    let log_ratio = Uniform::new(lo, hi).expect("lo < hi");
    for _ in 0..10 {
        let target = area * scale.sample(rng);
        let ratio = log_ratio.sample(rng).exp();
        let w = (target * ratio).sqrt().round();
        let h = (target / ratio).sqrt().round();
        if 0.0 < w && w <= w0 && 0.0 < h && h <= h0 {
            // torch.randint(0, n + 1): 0..=n.
            let top = Uniform::new_inclusive(0, (h0 - h) as u32)
                .expect("h <= height")
                .sample(rng);
            let left = Uniform::new_inclusive(0, (w0 - w) as u32)
                .expect("w <= width")
                .sample(rng);
            return Region {
                left: left as f64,
                top: top as f64,
                width: w,
                height: h,
            };
        }
    }
    // The fallback: the whole image, clamped to the ratio range, centered.
    let in_ratio = w0 / h0;
    let (w, h) = if in_ratio < 3.0 / 4.0 {
        (w0, (w0 / (3.0 / 4.0)).round())
    } else if in_ratio > 4.0 / 3.0 {
        ((h0 * (4.0 / 3.0)).round(), h0)
    } else {
        (w0, h0)
    };
    Region {
        left: ((w0 - w) / 2.0).floor(),
        top: ((h0 - h) / 2.0).floor(),
        width: w,
        height: h,
    }
}

/// The evaluation transform of a `width x height` image for an `out_w x out_h` input, as the
/// source region the center crop covers: the image resized so that its shorter side is
/// `round(max(out_w, out_h) / 0.875)` (the longer side scaled and truncated, torchvision's
/// `Resize`), then the center `out_w x out_h` of it (offsets rounded half to even, Python's
/// `round`, as `CenterCrop`). Also the resized size, for tests.
pub fn eval_region(width: u32, height: u32, out_w: u32, out_h: u32) -> (Region, (u32, u32)) {
    let short_target = (out_w.max(out_h) as f64 / 0.875).round() as u64;
    let (w, h) = (width as u64, height as u64);
    let (rw, rh) = if w <= h {
        (short_target, short_target * h / w)
    } else {
        (short_target * w / h, short_target)
    };
    // The crop is never larger than the resized image: its shorter side is at least
    // max(out_w, out_h) / 0.875.
    let left = ((rw as f64 - out_w as f64) / 2.0).round_ties_even();
    let top = ((rh as f64 - out_h as f64) / 2.0).round_ties_even();
    let (sx, sy) = (w as f64 / rw as f64, h as f64 / rh as f64);
    (
        Region {
            left: left * sx,
            top: top * sy,
            width: out_w as f64 * sx,
            height: out_h as f64 * sy,
        },
        (rw as u32, rh as u32),
    )
}

/// Reads and decodes `path` as 8-bit pixels of `channels` channels (1 or 3): grayscale
/// replicated to RGB and alpha dropped, as torchvision's loader (`convert("RGB")`) does. A
/// file that cannot be read or decoded is [`Failed::Skip`]; a color image for a one-channel
/// model is [`Failed::Fatal`] (it cannot be told which channel the model wants).
pub fn decode(path: &Path, channels: usize) -> Result<(Vec<u8>, u32, u32), Failed> {
    let img = image::ImageReader::open(path)
        .map_err(|e| Failed::Skip(format!("cannot read it: {e}")))?
        .with_guessed_format()
        .map_err(|e| Failed::Skip(format!("cannot read it: {e}")))?
        .decode()
        .map_err(|e| Failed::Skip(format!("cannot decode it: {e}")))?;
    let (w, h) = (img.width(), img.height());
    if w == 0 || h == 0 {
        return Err(Failed::Skip("it has no pixels".into()));
    }
    let color = img.color();
    let pixels = match channels {
        3 => img.into_rgb8().into_raw(),
        _ if gray(color) => to_luma(img),
        _ => {
            return Err(Failed::Fatal(DataError::model(
                path,
                format!(
                    "a {} image ({} channels) but the model takes {channels}-channel images; convert the folder's images to grayscale",
                    color_name(color),
                    color.channel_count()
                ),
            )))
        }
    };
    Ok((pixels, w, h))
}

fn gray(c: ColorType) -> bool {
    matches!(
        c,
        ColorType::L8 | ColorType::La8 | ColorType::L16 | ColorType::La16
    )
}

fn to_luma(img: DynamicImage) -> Vec<u8> {
    img.into_luma8().into_raw()
}

fn color_name(c: ColorType) -> &'static str {
    if c.has_alpha() {
        "color with alpha"
    } else {
        "color"
    }
}

/// Resizes `region` of the `w x h` image `pixels` (8-bit, `channels` of 1 or 3) to
/// `out_w x out_h`, then writes it into `row` (one sample of the input, `dtype` F32 or F64,
/// NCHW) normalised by `mean` and `std`, mirrored left to right when `flip`.
#[allow(clippy::too_many_arguments)]
pub fn resize_into(
    pixels: Vec<u8>,
    (w, h): (u32, u32),
    channels: usize,
    region: Region,
    (out_w, out_h): (u32, u32),
    flip: bool,
    (mean, std): (&[f32], &[f32]),
    dtype: DType,
    row: &mut [u8],
) -> Result<(), String> {
    let pt = if channels == 3 {
        PixelType::U8x3
    } else {
        PixelType::U8
    };
    let src = Image::from_vec_u8(w, h, pixels, pt).map_err(|e| e.to_string())?;
    let mut dst = Image::new(out_w, out_h, pt);
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(region.left, region.top, region.width, region.height);
    Resizer::new()
        .resize(&src, &mut dst, &options)
        .map_err(|e| e.to_string())?;
    let out = dst.buffer();
    let ow = out_w as usize;
    for c in 0..channels {
        let (m, s) = (mean[c], std[c]);
        // Each 8-bit level's normalised value, computed once per channel by the formula itself
        // (the same bits as computing it per pixel, in a table lookup).
        let (m64, s64) = (m as f64, s as f64);
        match dtype {
            DType::F64 => {
                let table: [[u8; 8]; 256] =
                    std::array::from_fn(|v| ((v as f64 / 255.0 - m64) / s64).to_ne_bytes());
                write_plane(&table, out, c, channels, ow, flip, row);
            }
            _ => {
                let table: [[u8; 4]; 256] =
                    std::array::from_fn(|v| ((v as f32 / 255.0 - m) / s).to_ne_bytes());
                write_plane(&table, out, c, channels, ow, flip, row);
            }
        }
    }
    Ok(())
}

/// Writes channel `c` of the interleaved 8-bit image `pixels` (rows of `width` pixels of
/// `channels`) into its plane of `row` (the channel planes one after another, `N` bytes an
/// element) through `table` (each level's bytes), mirrored when `flip`.
fn write_plane<const N: usize>(
    table: &[[u8; N]; 256],
    pixels: &[u8],
    c: usize,
    channels: usize,
    width: usize,
    flip: bool,
    row: &mut [u8],
) {
    let bytes = pixels.len() / channels * N;
    let plane = &mut row[c * bytes..][..bytes];
    for (line, src) in plane
        .chunks_exact_mut(width * N)
        .zip(pixels.chunks_exact(width * channels))
    {
        for (x, d) in line.chunks_exact_mut(N).enumerate() {
            let sx = if flip { width - 1 - x } else { x };
            d.copy_from_slice(&table[src[sx * channels + c] as usize]);
        }
    }
}
