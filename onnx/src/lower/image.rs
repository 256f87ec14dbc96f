//! Ops over images: convolutions, transposed convolutions, resizing and pooling.

use super::*;

impl Lower<'_> {
    /// GlobalAveragePool and GlobalMaxPool: a mean or max over every axis after N and C.
    pub(super) fn global_pool(&mut self, n: &NodeProto, op: &str) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let r = self.g.ty(x).shape.rank();
        if r < 3 {
            return Err(format!("needs an input [N, C, ...], got {}", self.g.ty(x)));
        }
        let axes: Vec<usize> = (2..r).collect();
        if op == "GlobalAveragePool" {
            one(ir(self.g.mean(x, &axes))?)
        } else {
            one(ir(self.g.max(x, &axes))?)
        }
    }

    /// Kernel, strides, symmetric padding and dilations of a 2-d window op over `x`.
    /// `x` as an image: `[N, C, L]` (a 1-d window op) becomes `[N, C, 1, L]`; whether it was.
    pub(super) fn as_image(&mut self, x: NodeId) -> R<(NodeId, bool)> {
        let d = self.g.ty(x).shape.dims().to_vec();
        match d.len() {
            4 => Ok((x, false)),
            3 => Ok((ir(self.g.reshape(x, [d[0], d[1], 1, d[2]]))?, true)),
            _ => Err(format!(
                "Ingot imports 1-d and 2-d windows over [N, C, L] or [N, C, H, W]; the input is {d:?}"
            )),
        }
    }

    /// A window op's output `[N, C, 1, L]` back as `[N, C, L]` when its input was 1-d.
    pub(super) fn image_back(&mut self, y: NodeId, one_d: bool) -> R<NodeId> {
        if !one_d {
            return Ok(y);
        }
        let d = self.g.ty(y).shape.dims().to_vec();
        ir(self.g.reshape(y, [d[0], d[1], d[3]]))
    }

    /// Kernel, strides, symmetric padding and dilations of a window op over the image `x`
    /// (`one_d`: the attributes are a 1-d op's, applied along the last axis).
    pub(super) fn window(
        &self,
        at: &Attrs,
        x: NodeId,
        kernel: Option<[usize; 2]>,
        one_d: bool,
    ) -> R<Window> {
        let d = self.g.ty(x).shape.dims().to_vec();
        let sp = if one_d { 1 } else { 2 };
        let two = |name: &str, default: usize| -> R<[usize; 2]> {
            match at.ints(name) {
                None => Ok([default; 2]),
                Some(v) if v.len() == sp && v.iter().all(|&x| x >= 0) => Ok(if one_d {
                    [default, v[0] as usize]
                } else {
                    [v[0] as usize, v[1] as usize]
                }),
                Some(v) => Err(format!("{name} {v:?} must be {sp} non-negative size(s)")),
            }
        };
        let k = match (at.ints("kernel_shape"), kernel) {
            (Some(_), _) => two("kernel_shape", 1)?,
            (None, Some(k)) => k,
            (None, None) => return Err("needs kernel_shape".into()),
        };
        if let Some(w) = kernel {
            if w != k {
                return Err(format!(
                    "kernel_shape {k:?} does not match the weight's {w:?}"
                ));
            }
        }
        let s = two("strides", 1)?;
        let dil = two("dilations", 1)?;
        if [k, s, dil].iter().flatten().any(|&v| v == 0) {
            return Err(format!(
                "kernel {k:?}, strides {s:?} and dilations {dil:?} must all be at least 1"
            ));
        }
        let pads = match at.ints("pads") {
            None => [0; 4],
            Some(p) if p.len() == 2 * sp && p.iter().all(|&x| x >= 0) => {
                if one_d {
                    [0, p[0] as usize, 0, p[1] as usize]
                } else {
                    [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
                }
            }
            Some(p) => return Err(format!("pads {p:?} must be {} non-negative sizes", 2 * sp)),
        };
        let pad = match at.string("auto_pad", "NOTSET").as_str() {
            "VALID" => [0, 0],
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut p = [0; 2];
                for i in 0..2 {
                    let (size, st) = (d[2 + i], s[i].max(1));
                    let out = size.div_ceil(st);
                    let total = ((out - 1) * st + (k[i] - 1) * dil[i] + 1).saturating_sub(size);
                    if total % 2 != 0 {
                        return Err(format!(
                            "auto_pad SAME needs {total} padding on axis {} (uneven: needs an explicit pad primitive)",
                            i + 2
                        ));
                    }
                    p[i] = total / 2;
                }
                p
            }
            _ => {
                if pads[0] != pads[2] || pads[1] != pads[3] {
                    return Err(format!(
                        "pads {pads:?} are not symmetric (Ingot's windows pad begin and end equally; an uneven pad needs an explicit pad primitive)"
                    ));
                }
                [pads[0], pads[1]]
            }
        };
        Ok((k, s, pad, dil))
    }

    /// The image input of convolution node `n` (a 1-d one made 2-d: `one_d`) and its kernel
    /// (a 1-d `[a, b, k]` made `[a, b, 1, k]`) with the kernel's dims; a kernel of another rank
    /// is refused, naming `what` Ingot imports.
    fn image_and_kernel(
        &mut self,
        n: &NodeProto,
        what: &str,
    ) -> R<(NodeId, bool, NodeId, Vec<usize>)> {
        let x = self.float_in(n, 0)?;
        let (x, one_d) = self.as_image(x)?;
        let w = self.float_in(n, 1)?;
        let w = match self.g.ty(w).shape.dims().to_vec()[..] {
            [a, b, k] if one_d => ir(self.g.reshape(w, [a, b, 1, k]))?,
            _ => w,
        };
        let wd = self.g.ty(w).shape.dims().to_vec();
        if wd.len() != 4 {
            return Err(format!(
                "Ingot imports 1-d and 2-d {what}; the weight is {wd:?}"
            ));
        }
        Ok((x, one_d, w, wd))
    }

    pub(super) fn conv(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let (x, one_d, w, wd) = self.image_and_kernel(n, "convolutions")?;
        let (_, stride, padding, dilation) = self.window(at, x, Some([wd[2], wd[3]]), one_d)?;
        let groups = at.int("group", 1);
        if groups < 1 {
            return Err(format!("group {groups} must be at least 1"));
        }
        let conv = Conv2d {
            stride,
            padding,
            dilation,
            groups: groups as usize,
            layout: Default::default(),
        };
        let mut y = ir(self.g.conv2d(x, w, conv))?;
        if let Some(b) = self.opt(n, 2)? {
            let b = self.node(&b, &n.input[2])?;
            let b = ir(self.g.reshape(b, [wd[0], 1, 1]))?;
            y = ir(self.g.add(y, b))?;
        }
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }

    /// `x` along `axis` with `begin` elements added before and `end` after (zeros), or
    /// removed where negative.
    pub(super) fn pad_axis(&mut self, x: NodeId, axis: usize, begin: i64, end: i64) -> R<NodeId> {
        let mut x = x;
        let size = self.g.ty(x).shape.dims()[axis] as i64;
        let (cut_b, cut_e) = ((-begin).max(0), (-end).max(0));
        if cut_b + cut_e >= size {
            return Err(format!(
                "the padding ({begin}, {end}) leaves nothing of an axis of {size}"
            ));
        }
        if cut_b > 0 || cut_e > 0 {
            x = ir(self
                .g
                .slice(x, axis, cut_b as usize, (size - cut_e) as usize))?;
        }
        let (add_b, add_e) = (begin.max(0) as usize, end.max(0) as usize);
        if add_b == 0 && add_e == 0 {
            return Ok(x);
        }
        let dt = self.g.ty(x).dtype;
        let mut parts = Vec::new();
        for (k, first) in [(add_b, true), (add_e, false)] {
            if k == 0 {
                continue;
            }
            let mut d = self.g.ty(x).shape.dims().to_vec();
            d[axis] = k;
            let z = ir(self.g.full(0.0, Shape::new(&d), dt))?;
            if first {
                parts.push(z);
                parts.push(x);
            } else {
                if parts.is_empty() {
                    parts.push(x);
                }
                parts.push(z);
            }
        }
        ir(self.g.concat(&parts, axis))
    }

    /// ConvTranspose (groups, strides, dilations, pads, output_padding; 1-d and 2-d) written
    /// with Ingot's differentiable ops: the input with `stride − 1` zeros between elements,
    /// padded by `(k − 1)·dilation − pad` (cut where negative) and `output_padding` more at the
    /// end, convolved with the kernel flipped in space and with its channel axes swapped
    /// (within each group). This is the transposed convolution's definition; autodiff gives
    /// its gradients (a convolution for the input, the weight's through the same conv).
    pub(super) fn conv_transpose(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let (x, one_d, w, wd) = self.image_and_kernel(n, "transposed convolutions")?;
        let xd = self.g.ty(x).shape.dims().to_vec();
        let groups = at.int("group", 1);
        if groups < 1 || !wd[0].is_multiple_of(groups as usize) || xd[1] != wd[0] {
            return Err(format!(
                "group {groups}: the weight {wd:?} must be [C_in, C_out/group, kH, kW] with C_in = the input's {} channels, divisible by the groups",
                xd[1]
            ));
        }
        let gr = groups as usize;
        let sp = if one_d { 1 } else { 2 };
        let two = |name: &str, default: i64| -> R<[i64; 2]> {
            match at.ints(name) {
                None => Ok([default; 2]),
                Some(v) if v.len() == sp && v.iter().all(|&x| x >= 0) => {
                    Ok(if one_d { [default, v[0]] } else { [v[0], v[1]] })
                }
                Some(v) => Err(format!("{name} {v:?} must be {sp} non-negative size(s)")),
            }
        };
        let k = [wd[2] as i64, wd[3] as i64];
        if let Some(ks) = at.ints("kernel_shape") {
            let want: Vec<i64> = if one_d { vec![k[1]] } else { k.to_vec() };
            if ks != want {
                return Err(format!(
                    "kernel_shape {ks:?} does not match the weight's {want:?}"
                ));
            }
        }
        let stride = two("strides", 1)?;
        let dil = two("dilations", 1)?;
        let op = two("output_padding", 0)?;
        if stride.contains(&0) || dil.contains(&0) {
            return Err(format!(
                "strides {stride:?} and dilations {dil:?} must be at least 1"
            ));
        }
        let pads: [i64; 4] = match at.ints("pads") {
            None => [0; 4],
            Some(p) if p.len() == 2 * sp && p.iter().all(|&x| x >= 0) => {
                if one_d {
                    [0, p[0], 0, p[1]]
                } else {
                    [p[0], p[1], p[2], p[3]]
                }
            }
            Some(p) => return Err(format!("pads {p:?} must be {} non-negative sizes", 2 * sp)),
        };
        // Zeros between elements: [N, C, H, W] -> [N, C, H, s, W, s] -> [N, C, Hs, Ws], cut
        // to (H − 1)s + 1.
        let (nb, c, h, wi) = (xd[0], xd[1], xd[2], xd[3]);
        let (sh, sw) = (stride[0] as usize, stride[1] as usize);
        let mut xs = x;
        if sh > 1 || sw > 1 {
            let x6 = ir(self.g.reshape(x, [nb, c, h, 1, wi, 1]))?;
            let x6 = self.pad_axis(x6, 3, 0, sh as i64 - 1)?;
            let x6 = self.pad_axis(x6, 5, 0, sw as i64 - 1)?;
            let x4 = ir(self.g.reshape(x6, [nb, c, h * sh, wi * sw]))?;
            let x4 = ir(self.g.slice(x4, 2, 0, (h - 1) * sh + 1))?;
            xs = ir(self.g.slice(x4, 3, 0, (wi - 1) * sw + 1))?;
        }
        // Padding: symmetric part by the convolution, the rest explicitly.
        let mut padding = [0usize; 2];
        for i in 0..2 {
            let full = (k[i] - 1) * dil[i];
            let (b, e) = (full - pads[i], full - pads[i + 2] + op[i]);
            let common = b.min(e).max(0);
            padding[i] = common as usize;
            xs = self.pad_axis(xs, 2 + i, b - common, e - common)?;
        }
        // The kernel: [C_in, C_out/g, kH, kW] -> [C_out, C_in/g, kH, kW], flipped in space.
        let (cin, cog) = (wd[0], wd[1]);
        let w5 = ir(self.g.reshape(w, [gr, cin / gr, cog, wd[2], wd[3]]))?;
        let w5 = ir(self.g.transpose(w5, &[0, 2, 1, 3, 4]))?;
        let mut wf = ir(self.g.reshape(w5, [gr * cog, cin / gr, wd[2], wd[3]]))?;
        for axis in [2, 3] {
            let size = wd[axis];
            if size > 1 {
                let parts: Vec<NodeId> = (0..size)
                    .rev()
                    .map(|i| ir(self.g.slice(wf, axis, i, i + 1)))
                    .collect::<R<_>>()?;
                wf = ir(self.g.concat(&parts, axis))?;
            }
        }
        let conv = Conv2d {
            stride: [1, 1],
            padding,
            dilation: [dil[0] as usize, dil[1] as usize],
            groups: gr,
            layout: Default::default(),
        };
        let mut y = ir(self.g.conv2d(xs, wf, conv))?;
        if let Some(b) = self.opt(n, 2)? {
            let b = self.node(&b, &n.input[2])?;
            let b = ir(self.g.reshape(b, [gr * cog, 1, 1]))?;
            y = ir(self.g.add(y, b))?;
        }
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }

    /// Resize by integer factors: `nearest` (each element repeated, which every coordinate
    /// mode with a floor or round gives for an integer factor) and `linear` with `half_pixel`,
    /// `pytorch_half_pixel` or `asymmetric` coordinates (each output element a fixed blend of
    /// an input element and its neighbour, edges clamped), one axis at a time.
    pub(super) fn resize(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let factors: Vec<usize> = match (self.konst(n, 2)?, self.konst(n, 3)?) {
            (Some(s), _) if s.numel() > 0 => {
                let s = s.to_f64s();
                if s.len() != d.len() {
                    return Err(format!(
                        "scales {s:?} must have one entry per axis of {d:?}"
                    ));
                }
                s.iter()
                    .map(|&f| {
                        if f >= 1.0 && f.fract() == 0.0 {
                            Ok(f as usize)
                        } else {
                            Err(format!("scale {f} is not a whole number of at least 1 (Ingot resizes by integer factors)"))
                        }
                    })
                    .collect::<R<_>>()?
            }
            (_, Some(z)) => {
                let z = z.to_i64s().ok_or("sizes must be integers")?;
                if z.len() != d.len() {
                    return Err(format!("sizes {z:?} must have one entry per axis of {d:?}"));
                }
                z.iter()
                    .zip(&d)
                    .map(|(&o, &i)| {
                        if o >= i as i64 && o % i as i64 == 0 {
                            Ok((o / i as i64) as usize)
                        } else {
                            Err(format!("size {o} is not a whole multiple of the input's {i} (Ingot resizes by integer factors)"))
                        }
                    })
                    .collect::<R<_>>()?
            }
            _ => return Err("needs scales or sizes".into()),
        };
        let mode = at.string("mode", "nearest");
        let ctm = at.string("coordinate_transformation_mode", "half_pixel");
        let mut y = x;
        for (axis, &s) in factors.iter().enumerate() {
            if s == 1 {
                continue;
            }
            y = match mode.as_str() {
                "nearest" => {
                    let nm = at.string("nearest_mode", "round_prefer_floor");
                    let ok = match ctm.as_str() {
                        "asymmetric" => nm == "floor",
                        "half_pixel" | "pytorch_half_pixel" => {
                            matches!(nm.as_str(), "round_prefer_floor" | "round_prefer_ceil")
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(format!(
                            "nearest with coordinate_transformation_mode {ctm:?} and nearest_mode {nm:?} does not repeat elements; Ingot imports asymmetric with floor (PyTorch's nn.Upsample) and half_pixel with round_prefer_floor/ceil"
                        ));
                    }
                    self.repeat_axis(y, axis, s)?
                }
                "linear" => {
                    let frac: Vec<f64> = match ctm.as_str() {
                        "half_pixel" | "pytorch_half_pixel" => (0..s)
                            .map(|r| (r as f64 + 0.5) / s as f64 - 0.5)
                            .collect(),
                        "asymmetric" => (0..s).map(|r| r as f64 / s as f64).collect(),
                        _ => {
                            return Err(format!(
                                "linear with coordinate_transformation_mode {ctm:?}: Ingot imports half_pixel, pytorch_half_pixel (PyTorch's align_corners=False) and asymmetric"
                            ))
                        }
                    };
                    self.lerp_axis(y, axis, &frac)?
                }
                m => {
                    return Err(format!(
                        "mode {m:?}: Ingot imports nearest and linear resizing"
                    ))
                }
            };
        }
        Ok(vec![Val::Node(y)])
    }

    /// Each element along `axis` repeated `s` times.
    pub(super) fn repeat_axis(&mut self, x: NodeId, axis: usize, s: usize) -> R<NodeId> {
        let d = self.g.ty(x).shape.dims().to_vec();
        let mut d1 = d[..=axis].to_vec();
        d1.push(1);
        d1.extend(&d[axis + 1..]);
        let x1 = ir(self.g.reshape(x, Shape::new(&d1)))?;
        let mut d2 = d1.clone();
        d2[axis + 1] = s;
        let x2 = ir(self.g.broadcast_to(x1, Shape::new(&d2)))?;
        let mut out = d.clone();
        out[axis] *= s;
        ir(self.g.reshape(x2, Shape::new(&out)))
    }

    /// Linear upsampling along `axis` by `frac.len()`: output `i·s + r` blends input `i` with
    /// its neighbour at offset `frac[r]` (below when negative), edges clamped.
    pub(super) fn lerp_axis(&mut self, x: NodeId, axis: usize, frac: &[f64]) -> R<NodeId> {
        let d = self.g.ty(x).shape.dims().to_vec();
        let size = d[axis];
        // x shifted by one either way, the edge element repeated.
        let (next, prev) = if size > 1 {
            let tail = ir(self.g.slice(x, axis, 1, size))?;
            let last = ir(self.g.slice(x, axis, size - 1, size))?;
            let head = ir(self.g.slice(x, axis, 0, size - 1))?;
            let first = ir(self.g.slice(x, axis, 0, 1))?;
            (
                ir(self.g.concat(&[tail, last], axis))?,
                ir(self.g.concat(&[first, head], axis))?,
            )
        } else {
            (x, x)
        };
        let mut d1 = d[..=axis].to_vec();
        d1.push(1);
        d1.extend(&d[axis + 1..]);
        let mut parts = Vec::new();
        for &f in frac {
            let (other, w) = if f < 0.0 { (prev, -f) } else { (next, f) };
            let p = if w == 0.0 {
                x
            } else {
                let a = ir(self.g.mul_scalar(x, 1.0 - w))?;
                let b = ir(self.g.mul_scalar(other, w))?;
                ir(self.g.add(a, b))?
            };
            parts.push(ir(self.g.reshape(p, Shape::new(&d1)))?);
        }
        let y = ir(self.g.concat(&parts, axis + 1))?;
        let mut out = d.clone();
        out[axis] *= frac.len();
        ir(self.g.reshape(y, Shape::new(&out)))
    }

    pub(super) fn max_pool(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let (x, one_d) = self.as_image(x)?;
        let (kernel, stride, padding, dilation) = self.window(at, x, None, one_d)?;
        let pool = Pool2d {
            kernel,
            stride,
            padding,
            dilation,
            layout: ingot_compiler::ir::ConvLayout::Nchw,
        };
        let y = ir(self.g.max_pool2d(x, pool))?;
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }

    /// Average pooling as a convolution of each channel with a constant window; with
    /// `count_include_pad=0` (ONNX's default) and padding, each window's sum is divided by the
    /// number of image elements it covers (a convolution of ones, which rewriting folds).
    pub(super) fn avg_pool(&mut self, n: &NodeProto, at: &Attrs) -> R<Vec<Val>> {
        let x = self.float_in(n, 0)?;
        let (x, one_d) = self.as_image(x)?;
        let (kernel, stride, padding, _) = self.window(at, x, None, one_d)?;
        let d = self.g.ty(x).shape.dims().to_vec();
        let dt = self.g.ty(x).dtype;
        let (nb, c, h, w) = (d[0], d[1], d[2], d[3]);
        let folded = ir(self.g.reshape(x, [nb * c, 1, h, w]))?;
        let conv = Conv2d {
            stride,
            padding,
            dilation: [1, 1],
            groups: 1,
            layout: Default::default(),
        };
        let area = (kernel[0] * kernel[1]) as f64;
        let exclude_pad = at.int("count_include_pad", 0) == 0 && padding != [0, 0];
        let y = if exclude_pad {
            let ones = ir(self.g.full(1.0, [1, 1, kernel[0], kernel[1]], dt))?;
            let sums = ir(self.g.conv2d(folded, ones, conv))?;
            let img = ir(self.g.full(1.0, [1, 1, h, w], dt))?;
            let counts = ir(self.g.conv2d(img, ones, conv))?;
            ir(self.g.div(sums, counts))?
        } else {
            let k = ir(self.g.full(1.0 / area, [1, 1, kernel[0], kernel[1]], dt))?;
            ir(self.g.conv2d(folded, k, conv))?
        };
        let o = self.g.ty(y).shape.dims().to_vec();
        let y = ir(self.g.reshape(y, [nb, c, o[2], o[3]]))?;
        Ok(vec![Val::Node(self.image_back(y, one_d)?)])
    }
}
