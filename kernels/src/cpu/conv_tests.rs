//! Tests of the im2col convolution passes: against plain loops and f64, and their bits across
//! lanes, workspaces and threads.

use super::*;

fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut g = ingot_testkit::lcg::Lcg::new(seed);
    (0..n).map(|_| g.unit53() * 2.0 - 1.0).collect()
}

fn geometries() -> Vec<ConvGeometry> {
    let mut out = Vec::new();
    for (x, w, s, p, d, gr) in [
        ([2, 3, 7, 6], [4, 3, 3, 3], 1, 1, 1, 1),
        ([2, 4, 9, 8], [6, 2, 3, 2], 2, 1, 1, 2),
        ([1, 4, 10, 10], [4, 1, 3, 3], 1, 2, 2, 4),
        ([3, 2, 5, 5], [3, 2, 1, 1], 1, 0, 1, 1),
        ([2, 3, 8, 7], [2, 3, 4, 3], 3, 2, 1, 1),
        // Pointwise (read in place), with groups and with channel ranges.
        ([2, 6, 5, 4], [4, 3, 1, 1], 1, 0, 1, 2),
        ([3, 21, 4, 3], [5, 21, 1, 1], 1, 0, 1, 1),
        ([2, 300, 3, 2], [3, 300, 1, 1], 1, 0, 1, 1),
        // A 1x1 kernel that is not pointwise (strided, padded).
        ([2, 4, 6, 6], [3, 4, 1, 1], 2, 1, 1, 1),
        // 37 channels (333 columns): weight-gradient ranges of 19 and 18 channels (552
        // positions: too many for blocks of images).
        ([2, 37, 24, 23], [3, 37, 3, 3], 1, 1, 1, 1),
        // Depthwise, more groups than lanes.
        ([2, 20, 5, 5], [20, 1, 3, 3], 1, 1, 1, 20),
        // Few positions an image: blocks of images, a last block short (forward blocks of
        // 28 images at 3x3, weight-gradient blocks of 7), strided, and at 1x1 (a ResNet's
        // last layer on small images; weight-gradient blocks of 64 and 6).
        ([30, 3, 3, 3], [4, 3, 3, 3], 1, 1, 1, 1),
        ([9, 4, 4, 4], [5, 4, 3, 3], 2, 1, 1, 1),
        ([70, 6, 1, 1], [5, 6, 3, 3], 1, 1, 1, 1),
        // Blocks of 256 images at 2x2 (1,024 columns), the last one of 44.
        ([300, 2, 2, 2], [3, 2, 3, 3], 1, 1, 1, 1),
        // Pointwise in blocks (the block's column buffer is a copy of its images).
        ([20, 5, 2, 2], [3, 5, 1, 1], 1, 0, 1, 1),
        // Weight gradients in parts of the images: 7 parts of 2 or 3 images (20 images of
        // 361 positions), with two groups; 3 parts, pointwise.
        ([20, 4, 19, 19], [6, 2, 3, 3], 1, 1, 1, 2),
        ([7, 5, 24, 20], [3, 5, 1, 1], 1, 0, 1, 1),
        // Weight gradients in parts summed in blocks of KC columns' images: 2 parts of 32
        // images at 6x6 (blocks of 7, the last of 4); 2 parts of 65 at 4x4 (blocks of 16,
        // the last of one).
        ([64, 3, 6, 6], [4, 3, 3, 3], 1, 1, 1, 1),
        ([130, 2, 4, 4], [3, 2, 3, 3], 1, 1, 1, 1),
    ] {
        out.push(ConvGeometry::new(x, w, [s, s], [p, p], [d, d], gr).unwrap());
    }
    out
}

#[test]
fn the_im2col_forward_matches_plain_loops_over_strides_padding_dilation_and_groups() {
    for g in geometries() {
        let x = values(g.x_len(), 1);
        let w = values(g.w_len(), 2);
        let want = reference(&g, &x, &w);
        let mut y = vec![f64::NAN; g.y_len()];
        let mut ws = vec![f64::NAN; workspace_len::<f64>(&g, Pass::Forward)];
        forward(&g, &x, &w, &mut y, &mut ws).unwrap();
        for (a, b) in y.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "{g:?}: {a} vs {b}");
        }
        // f32 agrees to f32 rounding.
        let (x32, w32): (Vec<f32>, Vec<f32>) = (
            x.iter().map(|&v| v as f32).collect(),
            w.iter().map(|&v| v as f32).collect(),
        );
        let mut y32 = vec![f32::NAN; g.y_len()];
        let mut ws32 = vec![f32::NAN; workspace_len::<f32>(&g, Pass::Forward)];
        forward(&g, &x32, &w32, &mut y32, &mut ws32).unwrap();
        for (a, b) in y32.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{g:?}: {a} vs {b}");
        }
    }
}

/// `<conv(x, w), dy> = <x, grad_input(dy, w)> = <w, grad_weight(x, dy)>`: both backward
/// passes are the adjoints of the forward one.
#[test]
fn both_backward_passes_are_the_adjoints_of_the_forward_pass() {
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for g in geometries() {
        let (x, w, dy) = (
            values(g.x_len(), 3),
            values(g.w_len(), 4),
            values(g.y_len(), 5),
        );
        let y = reference(&g, &x, &w);
        let mut dx = vec![f64::NAN; g.x_len()];
        let mut ws = vec![0.0; workspace_len::<f64>(&g, Pass::GradInput)];
        grad_input(&g, &dy, &w, &mut dx, &mut ws).unwrap();
        let mut dw = vec![f64::NAN; g.w_len()];
        let mut ws = vec![0.0; workspace_len::<f64>(&g, Pass::GradWeight)];
        grad_weight(&g, &x, &dy, &mut dw, &mut ws).unwrap();
        let lhs = dot(&y, &dy);
        assert!((lhs - dot(&x, &dx)).abs() < 1e-9, "{g:?}: input adjoint");
        assert!((lhs - dot(&w, &dw)).abs() < 1e-9, "{g:?}: weight adjoint");
    }
}

/// Calls `f(n, group, columns)` for each image `n` of `images` and each group, in that
/// order, with the group's column buffer of that image ([`im2col`]).
fn each_image_columns(
    g: &ConvGeometry,
    x: &[f32],
    images: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, &[f32]),
) {
    let xg = g.in_ch / g.groups * g.in_hw[0] * g.in_hw[1];
    let mut col = vec![0f32; g.col_rows() * g.positions()];
    for n in images {
        for gi in 0..g.groups {
            let xs = (n * g.groups + gi) * xg;
            im2col(g, &x[xs..xs + xg], &mut col);
            f(n, gi, &col);
        }
    }
}

/// The passes as they ran before lanes: one image and one whole group at a time through
/// a full column buffer, the weight gradient summed over the images in order
/// ([`weight_parts_one_image_at_a_time`] with one part; or, where it runs in blocks of
/// images, [`weight_blocks_one_image_at_a_time`]'s).
fn one_unit_at_a_time(g: &ConvGeometry, x: &[f32], w: &[f32], dy: &[f32]) -> [Vec<f32>; 3] {
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let xg = g.in_ch / g.groups * g.in_hw[0] * g.in_hw[1];
    let mut dcol = vec![0f32; k * p];
    let glen = gemm_len::<f32>(og, k, p).max(gemm_len::<f32>(k, og, p));
    let mut gws = vec![0f32; glen];
    let (mut y, mut dx) = (vec![0f32; g.y_len()], vec![0f32; g.x_len()]);
    let rm = MatLayout::row_major;
    each_image_columns(g, x, 0..g.batch, |n, gi, col| {
        let (xs, ys) = ((n * g.groups + gi) * xg, (n * g.out_ch + gi * og) * p);
        let wg = gi * og * k;
        gemm_ws(
            og,
            k,
            p,
            1.0,
            w,
            rm(k).at(wg),
            col,
            rm(p),
            0.0,
            &mut y,
            rm(p).at(ys),
            &mut gws,
        )
        .unwrap();
        let wt = MatLayout::col_major(k).at(wg);
        gemm_ws(
            k,
            og,
            p,
            1.0,
            w,
            wt,
            dy,
            rm(p).at(ys),
            0.0,
            &mut dcol,
            rm(p),
            &mut gws,
        )
        .unwrap();
        col2im_add(g, &dcol, &mut dx[xs..xs + xg]);
    });
    let blocks = block_images::<f32>(g, Pass::GradWeight).unwrap_or(1);
    let dw = match part_cut::<f32>(g) {
        Some(c) => weight_parts_one_image_at_a_time(g, x, dy, c.parts, c.images),
        None => weight_parts_one_image_at_a_time(g, x, dy, 1, blocks),
    };
    [y, dx, dw]
}

/// The weight gradient in `parts` parts of the images: each part's images summed in order
/// into a `dw` of its own (one at a time, or with `per` above one in blocks of `per` images
/// from the part's first, [`weight_blocks_one_image_at_a_time`]), the first image or block
/// writing it and each later one adding, then the parts' `dw`s added element by element in
/// part order.
fn weight_parts_one_image_at_a_time(
    g: &ConvGeometry,
    x: &[f32],
    dy: &[f32],
    parts: usize,
    per: usize,
) -> Vec<f32> {
    let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
    let mut gws = vec![0f32; gemm_len::<f32>(og, p, k)];
    let mut sum = vec![0f32; g.w_len()];
    for j in 0..parts {
        let mut part = vec![f32::NAN; g.w_len()];
        let images = j * g.batch / parts..(j + 1) * g.batch / parts;
        let first = images.start;
        let one_at_a_time = if per > 1 {
            part = weight_blocks_one_image_at_a_time(g, x, dy, images, per);
            0..0
        } else {
            images
        };
        each_image_columns(g, x, one_at_a_time, |n, gi, col| {
            let ys = (n * g.out_ch + gi * og) * p;
            gemm_ws(
                og,
                p,
                k,
                1.0,
                dy,
                MatLayout::row_major(p).at(ys),
                col,
                MatLayout::col_major(p),
                if n == first { 0.0 } else { 1.0 },
                &mut part,
                MatLayout::row_major(k).at(gi * og * k),
                &mut gws,
            )
            .unwrap();
        });
        for (s, v) in sum.iter_mut().zip(&part) {
            *s = if j == 0 { *v } else { *s + v };
        }
    }
    sum
}

/// The weight gradient of `range`'s images in blocks of `images` images, each block's column
/// buffer and output gradient assembled one image and one element at a time from the
/// image's own column buffer ([`im2col`]), then one GEMM a block, the blocks added in order.
fn weight_blocks_one_image_at_a_time(
    g: &ConvGeometry,
    x: &[f32],
    dy: &[f32],
    range: std::ops::Range<usize>,
    images: usize,
) -> Vec<f32> {
    let (o, k, p) = (g.out_ch, g.col_rows(), g.positions());
    let xi = g.in_ch * g.in_hw[0] * g.in_hw[1];
    let mut dw = vec![f32::NAN; g.w_len()];
    let mut one = vec![0f32; k * p];
    for (b, n0) in range.clone().step_by(images).enumerate() {
        let nb = images.min(range.end - n0);
        let cols = nb * p;
        let (mut col, mut d) = (vec![0f32; k * cols], vec![0f32; o * cols]);
        for i in 0..nb {
            let n = n0 + i;
            im2col(g, &x[n * xi..(n + 1) * xi], &mut one);
            for r in 0..k {
                for q in 0..p {
                    col[r * cols + i * p + q] = one[r * p + q];
                }
            }
            for r in 0..o {
                for q in 0..p {
                    d[r * cols + i * p + q] = dy[(n * o + r) * p + q];
                }
            }
        }
        let mut gws = vec![0f32; gemm_len::<f32>(o, cols, k)];
        let beta = if b == 0 { 0.0 } else { 1.0 };
        gemm_ws(
            o,
            cols,
            k,
            1.0,
            &d,
            MatLayout::row_major(cols),
            &col,
            MatLayout::col_major(cols),
            beta,
            &mut dw,
            MatLayout::row_major(k),
            &mut gws,
        )
        .unwrap();
    }
    dw
}

/// Workspace lengths from the least to the most a pass uses, through every lane count
/// of both cuts (whole groups, channel ranges) and an element past each, those the pass
/// runs in (at least [`workspace_len`]).
fn lengths(g: &ConvGeometry, pass: Pass) -> Vec<usize> {
    let mut out = vec![workspace_len_up_to::<f32>(g, pass) + 5];
    // Blocks of every size up to the full one (the forward and input-gradient passes run
    // the largest that fits).
    let blocks = block_cut::<f32>(g, pass)
        .into_iter()
        .flat_map(|b| (2..=b.images).map(|i| block_cut_of::<f32>(g, pass, i)));
    for c in cuts::<f32>(g, pass).into_iter().chain(blocks) {
        for lanes in 1..=c.most {
            out.extend([c.len(lanes), c.len(lanes) + 1]);
        }
    }
    let least = workspace_len::<f32>(g, pass);
    out.retain(|&len| len >= least);
    out.sort_unstable();
    out.dedup();
    out
}

#[test]
fn every_lane_count_channel_ranges_and_pointwise_operands_give_the_bits_of_one_whole_group_at_a_time(
) {
    let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
    // One-pixel images run through their live tap (`conv_one_tap`, tested there).
    for g in geometries()
        .into_iter()
        .filter(|g| one_tap::live_tap(g).is_none())
    {
        let (x, w, dy) = (
            f32s(values(g.x_len(), 6)),
            f32s(values(g.w_len(), 7)),
            f32s(values(g.y_len(), 8)),
        );
        let want = one_unit_at_a_time(&g, &x, &w, &dy);
        let same = |name: &str, a: &[f32], b: &[f32], len: usize| {
            assert!(
                a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{g:?}: {name} in {len} elements of workspace differs from one whole group at a time"
            );
        };
        for len in lengths(&g, Pass::Forward) {
            let mut y = vec![f32::NAN; g.y_len()];
            forward(&g, &x, &w, &mut y, &mut vec![f32::NAN; len]).unwrap();
            same("y", &y, &want[0], len);
        }
        for len in lengths(&g, Pass::GradInput) {
            let mut dx = vec![f32::NAN; g.x_len()];
            grad_input(&g, &dy, &w, &mut dx, &mut vec![f32::NAN; len]).unwrap();
            same("dx", &dx, &want[1], len);
        }
        for len in lengths(&g, Pass::GradWeight) {
            let mut dw = vec![f32::NAN; g.w_len()];
            grad_weight(&g, &x, &dy, &mut dw, &mut vec![f32::NAN; len]).unwrap();
            same("dw", &dw, &want[2], len);
        }
    }
}

/// The least workspace holds one image and group's column buffer and GEMM space (a
/// pointwise convolution's is smaller still), or, for the weight gradient of small images,
/// one lane of a whole block (its blocks fix the order of its sums), for the forward and
/// input gradient the largest block within a quarter more than one image's, and a
/// one-pixel convolution's one GEMM over the batch.
#[test]
fn the_least_workspace_is_one_image_or_a_small_image_weight_gradients_block() {
    for g in geometries() {
        let (og, k, p) = (g.out_ch / g.groups, g.col_rows(), g.positions());
        let before = [
            (Pass::Forward, k * p + gemm_len::<f32>(og, k, p)),
            (Pass::GradInput, k * p + gemm_len::<f32>(k, og, p)),
            (Pass::GradWeight, k * p + gemm_len::<f32>(og, p, k)),
        ];
        for (pass, old) in before {
            let least = workspace_len::<f32>(&g, pass);
            if one_tap::live_tap(&g).is_some() {
                assert_eq!(least, one_tap::workspace_len::<f32>(&g, pass));
                continue;
            }
            if let Some(c) = part_cut::<f32>(&g).filter(|_| pass == Pass::GradWeight) {
                // One lane of parts: a group's column buffer (a block's, with the block's
                // output gradient side by side, where the parts sum blocks of images), GEMM
                // space and block of sums.
                let (block, cols) = (og * k, c.images * p);
                let (col, tmp) = match c.images {
                    1 if is_pointwise(&g) => (0, 0),
                    1 => (k * p, 0),
                    _ => (k * cols, og * cols),
                };
                assert_eq!(
                    least,
                    col + tmp + gemm_len::<f32>(og, cols, k) + block,
                    "{g:?}"
                );
                assert_eq!(least, c.len(1), "{g:?}");
                let s = split::<f32>(&g, pass, least).unwrap();
                assert_eq!((s.lanes, s.parts), (1, image_parts(&g, pass)), "{g:?}");
                assert!(s.parts >= 2, "{g:?}");
                assert_eq!(split::<f32>(&g, pass, least - 1), None, "{g:?} {pass:?}");
                continue;
            }
            if let Some(b) = block_cut::<f32>(&g, pass).filter(|_| pass == Pass::GradWeight) {
                assert_eq!(least, b.len(1).max(old), "{g:?} {pass:?}");
                let s = split::<f32>(&g, pass, least).unwrap();
                let cols = weight_block_columns(&g);
                assert_eq!(s.images, (cols / p).min(g.batch), "{g:?} {pass:?}");
                assert!(s.len(1) * 4 <= LANE_BUDGET_BYTES, "{g:?} {pass:?}");
                continue;
            }
            if let Some(b) = least_block::<f32>(&g, pass) {
                assert_eq!(least, b.len(1).max(old), "{g:?} {pass:?}");
                assert!(4 * least <= LEAST_BLOCK_GROWTH * old, "{g:?} {pass:?}");
                assert_eq!(
                    split::<f32>(&g, pass, least).map(|s| s.images),
                    Some(b.images)
                );
                continue;
            }
            if is_pointwise(&g) {
                assert!(least < old, "{g:?} {pass:?}: {least} vs {old}");
            } else {
                assert_eq!(least, old, "{g:?} {pass:?}");
            }
            assert_eq!(split::<f32>(&g, pass, least).map(|s| s.lanes), Some(1));
            assert_eq!(split::<f32>(&g, pass, least - 1), None, "{g:?} {pass:?}");
        }
    }
}

#[test]
fn the_most_workspace_is_cut_into_at_most_max_lanes_lanes_within_the_budget() {
    // resnet18's 3x3 convolutions at 8x8, batch 128.
    let small =
        ConvGeometry::new([128, 64, 8, 8], [64, 64, 3, 3], [1, 1], [1, 1], [1, 1], 1).unwrap();
    for pass in [Pass::Forward, Pass::GradInput, Pass::GradWeight] {
        let most = workspace_len_up_to::<f32>(&small, pass);
        let s = split::<f32>(&small, pass, most).unwrap();
        let want = match pass {
            // Its weight gradient: 8 parts of 16 images (8,192 positions over
            // MIN_PART_POSITIONS), each summed in blocks of 4 images (KC = 256 columns:
            // WIDE_WEIGHT_COLUMNS), five lanes of 1.4 MiB within the budget.
            Pass::GradWeight => (8, 64, 5, 4),
            // The others: blocks of 16 images too, two lanes of about 3 MiB.
            Pass::Forward | Pass::GradInput => (8, 64, 2, 16),
        };
        assert_eq!((s.units, s.chunk, s.lanes, s.images), want, "{pass:?}");
        // More bytes than it uses run no more lanes.
        assert_eq!(split::<f32>(&small, pass, 2 * most), Some(s), "{pass:?}");
    }
    // 37 channels of 3x3 (333 columns, as in `geometries`; 1,104 positions: one part):
    // two ranges, summed apart.
    let g37 = ConvGeometry::new([2, 37, 24, 23], [3, 37, 3, 3], [1, 1], [1, 1], [1, 1], 1).unwrap();
    let s = split::<f32>(&g37, Pass::GradWeight, usize::MAX).unwrap();
    assert_eq!(
        (s.units, s.chunk, s.partial),
        (2, 19, 2 * 3 * 19 * 9),
        "{s:?}"
    );
    // A ResNet-50 stem at 224x224: 7 MiB column buffers, so fewer lanes.
    let big =
        ConvGeometry::new([128, 3, 224, 224], [64, 3, 7, 7], [2, 2], [3, 3], [1, 1], 1).unwrap();
    let s = split::<f32>(&big, Pass::Forward, usize::MAX).unwrap();
    assert!(s.lanes < MAX_LANES && s.lanes >= 1, "{s:?}");
    assert!(4 * s.lanes * s.lane_len <= LANE_BUDGET_BYTES, "{s:?}");
    // resnet18's 3x3 convolutions at 2x2 (256 channels): the forward and input gradient
    // one GEMM over the batch's 512 columns in their most workspace, blocks of two images or
    // more in their least (within a quarter more than one image's); the weight gradient in
    // blocks of 64 images (KC = 256 columns: the batch's 512 columns reach
    // WIDE_WEIGHT_COLUMNS), added in order, in its least already.
    let wide = ConvGeometry::new(
        [128, 256, 2, 2],
        [256, 256, 3, 3],
        [1, 1],
        [1, 1],
        [1, 1],
        1,
    )
    .unwrap();
    for pass in [Pass::Forward, Pass::GradInput] {
        let most = workspace_len_up_to::<f32>(&wide, pass);
        let s = split::<f32>(&wide, pass, most).unwrap();
        assert_eq!(
            (s.units, s.images, s.lanes, s.partial),
            (1, 128, 1, 0),
            "{s:?}"
        );
        assert!(4 * most <= LANE_BUDGET_BYTES);
        let s = split::<f32>(&wide, pass, workspace_len::<f32>(&wide, pass)).unwrap();
        let b = least_block::<f32>(&wide, pass).unwrap();
        assert!(
            s.images >= 2 && (s.images, s.lanes) == (b.images, 1),
            "{s:?}"
        );
    }
    let least = workspace_len::<f32>(&wide, Pass::GradWeight);
    let s = split::<f32>(&wide, Pass::GradWeight, least).unwrap();
    assert_eq!(
        (s.units, s.images, s.lanes, s.partial),
        (2, 64, 1, 0),
        "{s:?}"
    );
    // A pointwise convolution needs no column buffer one image at a time (images of more
    // than 512 positions; smaller ones run in blocks, copied side by side).
    let pw =
        ConvGeometry::new([8, 64, 24, 24], [256, 64, 1, 1], [1, 1], [0, 0], [1, 1], 1).unwrap();
    let least = workspace_len::<f32>(&pw, Pass::Forward);
    assert_eq!(split::<f32>(&pw, Pass::Forward, least).unwrap().col_len, 0);
}

/// Every pass, in the least and the most workspace, inside pools of 1, 2, 3 and 16
/// threads: the bits of one thread (the lanes, blocks and GEMM tiles spread over the
/// threads, never the terms of one sum).
#[test]
fn every_pass_gives_the_same_bits_on_1_2_3_and_16_threads() {
    let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
    // Large enough to wake the threads (past PARALLEL_ELEMENTS and the GEMM's threshold).
    let mut gs = geometries();
    gs.push(ConvGeometry::new([64, 64, 2, 2], [96, 64, 3, 3], [1, 1], [1, 1], [1, 1], 1).unwrap());
    gs.push(ConvGeometry::new([8, 16, 12, 12], [32, 16, 3, 3], [1, 1], [1, 1], [1, 1], 1).unwrap());
    for g in gs {
        let (x, w, dy) = (
            f32s(values(g.x_len(), 9)),
            f32s(values(g.w_len(), 10)),
            f32s(values(g.y_len(), 11)),
        );
        let run = |pass: Pass, len: usize| -> Vec<u32> {
            let mut ws = vec![f32::NAN; len];
            let out = match pass {
                Pass::Forward => {
                    let mut y = vec![f32::NAN; g.y_len()];
                    forward(&g, &x, &w, &mut y, &mut ws).map(|_| y)
                }
                Pass::GradInput => {
                    let mut dx = vec![f32::NAN; g.x_len()];
                    grad_input(&g, &dy, &w, &mut dx, &mut ws).map(|_| dx)
                }
                Pass::GradWeight => {
                    let mut dw = vec![f32::NAN; g.w_len()];
                    grad_weight(&g, &x, &dy, &mut dw, &mut ws).map(|_| dw)
                }
            };
            out.unwrap().iter().map(|v| v.to_bits()).collect()
        };
        for pass in [Pass::Forward, Pass::GradInput, Pass::GradWeight] {
            let lens = [
                workspace_len::<f32>(&g, pass),
                workspace_len_up_to::<f32>(&g, pass),
            ];
            let want = run(pass, lens[0]);
            for threads in [1, 2, 3, 16] {
                let pool = crate::cpu::par::pool_of(threads);
                for len in lens {
                    let got = pool.install(|| run(pass, len));
                    assert!(
                        got == want,
                        "{g:?} {pass:?}: {threads} threads in {len} elements differ"
                    );
                }
            }
        }
    }
}

/// The weight gradient with plain loops in f64: `dw[o, c, a, b] = Σ_n Σ_(i, j)
/// dy[n, o, i, j] · x[n, group's c, i·s + a·d − p, j·s + b·d − p]`.
fn weight_gradient_by_loops(g: &ConvGeometry, x: &[f64], dy: &[f64]) -> Vec<f64> {
    let (cg, og) = (g.in_ch / g.groups, g.out_ch / g.groups);
    let ([h, wd], [oh, ow], [kh, kw]) = (g.in_hw, g.out_hw, g.kernel);
    let mut dw = vec![0.0; g.w_len()];
    for n in 0..g.batch {
        for o in 0..g.out_ch {
            let gi = o / og;
            for c in 0..cg {
                for (a, b) in (0..kh).flat_map(|a| (0..kw).map(move |b| (a, b))) {
                    let mut sum = 0.0;
                    for (i, j) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
                        let ih = (i * g.stride[0] + a * g.dilation[0]).wrapping_sub(g.padding[0]);
                        let iw = (j * g.stride[1] + b * g.dilation[1]).wrapping_sub(g.padding[1]);
                        if ih < h && iw < wd {
                            let xv = x[((n * g.in_ch + gi * cg + c) * h + ih) * wd + iw];
                            sum += dy[((n * g.out_ch + o) * oh + i) * ow + j] * xv;
                        }
                    }
                    dw[((o * cg + c) * kh + a) * kw + b] += sum;
                }
            }
        }
    }
    dw
}

/// cnn's conv2 at a batch of 16 (32 to 64 channels of 3x3 at 14x14: 3 parts of 5 or 6
/// images) and a grouped, strided one: the weight gradient summed in parts of the images
/// gives one set of bits on 1, 2, 3 and 16 threads in its least and most workspace, and
/// agrees with plain f64 loops to f32 rounding.
#[test]
fn the_weight_gradient_in_parts_of_the_images_repeats_on_any_threads_and_matches_f64_loops() {
    for g in [
        ConvGeometry::new([16, 32, 14, 14], [64, 32, 3, 3], [1, 1], [1, 1], [1, 1], 1),
        ConvGeometry::new([40, 6, 17, 17], [4, 3, 3, 3], [2, 2], [1, 1], [1, 1], 2),
    ] {
        let g = g.unwrap();
        let parts = image_parts(&g, Pass::GradWeight);
        assert!(parts >= 2 && part_cut::<f32>(&g).is_some(), "{g:?}");
        let (x, dy) = (values(g.x_len(), 12), values(g.y_len(), 13));
        let want = weight_gradient_by_loops(&g, &x, &dy);
        let (x32, dy32): (Vec<f32>, Vec<f32>) = (
            x.iter().map(|&v| v as f32).collect(),
            dy.iter().map(|&v| v as f32).collect(),
        );
        let lens = [
            workspace_len::<f32>(&g, Pass::GradWeight),
            workspace_len_up_to::<f32>(&g, Pass::GradWeight),
        ];
        assert!(
            lens[1] > lens[0],
            "{g:?}: the most workspace holds several lanes"
        );
        let run = |len: usize| {
            let mut dw = vec![f32::NAN; g.w_len()];
            grad_weight(&g, &x32, &dy32, &mut dw, &mut vec![f32::NAN; len]).unwrap();
            dw.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let first = run(lens[0]);
        let reduction = (g.batch * g.positions()) as f64;
        for (a, b) in first.iter().zip(&want) {
            let a = f32::from_bits(*a) as f64;
            assert!((a - b).abs() < 1e-6 * reduction, "{g:?}: {a} vs {b}");
        }
        for threads in [1, 2, 3, 16] {
            let pool = crate::cpu::par::pool_of(threads);
            for len in lens {
                assert!(
                    pool.install(|| run(len)) == first,
                    "{g:?}: {threads} threads in {len} elements differ"
                );
            }
        }
    }
}

#[test]
fn a_short_buffer_is_an_error_before_anything_is_written() {
    let g = geometries()[0];
    let mut y = vec![7.0f64; g.y_len()];
    let mut ws = vec![0.0; 3];
    let e = forward(
        &g,
        &vec![0.0; g.x_len()],
        &vec![0.0; g.w_len()],
        &mut y,
        &mut ws,
    )
    .unwrap_err();
    assert!(e.to_string().contains("workspace"), "{e}");
    assert!(y.iter().all(|&v| v == 7.0));
}

/// The weight gradients of resnet18's 3x3 convolutions at 8x8, 4x4 and 2x2 (batch 128) and of
/// a batch of 1,200 columns at 2x2: where positions divide the GEMM's reduction block
/// (`KC`), a part's blocks of `KC` columns chained give the bits of one GEMM over the part's
/// columns side by side, and `dw` is the parts' products added in order; the same bits on 1,
/// 2, 3 and 16 threads in the least and most workspace; within f32 rounding of f64 loops.
#[test]
fn small_image_weight_gradients_are_one_gemm_a_part_on_any_threads_and_match_f64_loops() {
    let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
    for (x, w, parts) in [
        ([128, 64, 8, 8], [64, 64, 3, 3], 8),
        ([128, 128, 4, 4], [128, 128, 3, 3], 2),
        ([128, 256, 2, 2], [256, 256, 3, 3], 1),
        ([300, 2, 2, 2], [3, 2, 3, 3], 1),
    ] {
        let g = ConvGeometry::new(x, w, [1, 1], [1, 1], [1, 1], 1).unwrap();
        let (o, k, p) = (g.out_ch, g.col_rows(), g.positions());
        assert_eq!(image_parts(&g, Pass::GradWeight), parts, "{g:?}");
        let s = split::<f32>(
            &g,
            Pass::GradWeight,
            workspace_len::<f32>(&g, Pass::GradWeight),
        )
        .unwrap();
        assert_eq!(
            s.images * p,
            super::super::gemm::KC,
            "{g:?}: blocks of KC columns"
        );
        let (x64, dy64) = (values(g.x_len(), 14), values(g.y_len(), 15));
        let (x, dy) = (f32s(&x64), f32s(&dy64));
        // Each part as one GEMM over its images' columns side by side, parts added in order.
        let xi = g.in_ch * g.in_hw[0] * g.in_hw[1];
        let mut want = vec![0f32; g.w_len()];
        for j in 0..parts {
            let (n0, n1) = (j * g.batch / parts, (j + 1) * g.batch / parts);
            let cols = (n1 - n0) * p;
            let (mut col, mut d) = (vec![0f32; k * cols], vec![0f32; o * cols]);
            im2col_images(&g, &x[n0 * xi..n1 * xi], n1 - n0, &mut col);
            to_side_by_side(n1 - n0, o, p, &dy[n0 * o * p..n1 * o * p], &mut d);
            let mut part = vec![f32::NAN; g.w_len()];
            let mut gws = vec![0f32; gemm_len::<f32>(o, cols, k)];
            gemm_ws(
                o,
                cols,
                k,
                1.0,
                &d,
                MatLayout::row_major(cols),
                &col,
                MatLayout::col_major(cols),
                0.0,
                &mut part,
                MatLayout::row_major(k),
                &mut gws,
            )
            .unwrap();
            for (s, v) in want.iter_mut().zip(&part) {
                *s = if j == 0 { *v } else { *s + v };
            }
        }
        let by_loops = weight_gradient_by_loops(&g, &x64, &dy64);
        let scale = (g.batch * p) as f64;
        for (a, b) in want.iter().zip(&by_loops) {
            assert!((*a as f64 - b).abs() < 1e-6 * scale, "{g:?}: {a} vs {b}");
        }
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        let lens = [
            workspace_len::<f32>(&g, Pass::GradWeight),
            workspace_len_up_to::<f32>(&g, Pass::GradWeight),
        ];
        for threads in [1, 2, 3, 16] {
            let pool = crate::cpu::par::pool_of(threads);
            for len in lens {
                let got = pool.install(|| {
                    let mut dw = vec![f32::NAN; g.w_len()];
                    grad_weight(&g, &x, &dy, &mut dw, &mut vec![f32::NAN; len]).unwrap();
                    dw.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
                });
                assert!(
                    got == want,
                    "{g:?}: {threads} threads in {len} elements differ"
                );
            }
        }
    }
}

/// The input gradient with plain loops in f64: `dx[n, c, ih, iw] = Σ w[o, c, a, b] ·
/// dy[n, o, i, j]` over the output channels of `c`'s group and the positions `(i, j)` whose
/// tap `(a, b)` reads `(ih, iw)`.
fn input_gradient_by_loops(g: &ConvGeometry, w: &[f64], dy: &[f64]) -> Vec<f64> {
    let (cg, og) = (g.in_ch / g.groups, g.out_ch / g.groups);
    let ([h, wd], [oh, ow], [kh, kw]) = (g.in_hw, g.out_hw, g.kernel);
    let mut dx = vec![0.0; g.x_len()];
    for n in 0..g.batch {
        for o in 0..g.out_ch {
            let gi = o / og;
            for (i, j) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
                let d = dy[((n * g.out_ch + o) * oh + i) * ow + j];
                for c in 0..cg {
                    for (a, b) in (0..kh).flat_map(|a| (0..kw).map(move |b| (a, b))) {
                        let ih = (i * g.stride[0] + a * g.dilation[0]).wrapping_sub(g.padding[0]);
                        let iw = (j * g.stride[1] + b * g.dilation[1]).wrapping_sub(g.padding[1]);
                        if ih < h && iw < wd {
                            let xi = ((n * g.in_ch + gi * cg + c) * h + ih) * wd + iw;
                            dx[xi] += w[((o * cg + c) * kh + a) * kw + b] * d;
                        }
                    }
                }
            }
        }
    }
    dx
}

/// resnet18's 3x3 convolutions at 8x8, 4x4 and 2x2 (batch 128), one with 13 channels (tiles
/// of 8 and 5 channels, of 16, 16 and 5 images) and a strided one at 3x3 outputs: the forward
/// and input gradient of small images, run in tiles of images (and channels) on one thread a
/// lane, give the bits of one image at a time on 1, 2, 3 and 16 threads in the least and most
/// workspace, within f32 rounding of f64 loops; resnet18's input gradients fill
/// [`MAX_LANES`] lanes of tiles from the workspace the blocks' cut was given.
#[test]
fn small_image_forwards_and_input_gradients_in_tiles_give_one_image_at_a_time_bits_on_any_threads()
{
    let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
    for (x, w, s, resnet) in [
        ([128, 64, 8, 8], [64, 64, 3, 3], 1, true),
        ([128, 128, 4, 4], [128, 128, 3, 3], 1, true),
        ([128, 256, 2, 2], [256, 256, 3, 3], 1, true),
        ([37, 13, 4, 4], [10, 13, 3, 3], 1, false),
        ([45, 20, 6, 6], [12, 20, 3, 3], 2, false),
    ] {
        let g = ConvGeometry::new(x, w, [s, s], [1, 1], [1, 1], 1).unwrap();
        let (x64, w64, dy64) = (
            values(g.x_len(), 16),
            values(g.w_len(), 17),
            values(g.y_len(), 18),
        );
        let (x, w, dy) = (f32s(&x64), f32s(&w64), f32s(&dy64));
        let [want_y, want_dx, _] = one_unit_at_a_time(&g, &x, &w, &dy);
        let terms = (g.out_ch * g.kernel[0] * g.kernel[1]) as f64;
        let dx_loops = input_gradient_by_loops(&g, &w64, &dy64);
        for (a, b) in want_dx.iter().zip(&dx_loops) {
            assert!((*a as f64 - b).abs() < 1e-6 * terms, "{g:?}: {a} vs {b}");
        }
        for (a, b) in want_y.iter().zip(&reference(&g, &x64, &w64)) {
            assert!((*a as f64 - b).abs() < 1e-6 * g.col_rows() as f64, "{g:?}");
        }
        for (pass, want) in [(Pass::Forward, &want_y), (Pass::GradInput, &want_dx)] {
            let lens = [
                workspace_len::<f32>(&g, pass),
                workspace_len_up_to::<f32>(&g, pass),
            ];
            let most = split::<f32>(&g, pass, lens[1]).unwrap();
            assert!(most.images > 1, "{g:?} {pass:?}: blocks of images");
            let t = tiles::<f32>(&g, pass, most.images, most.lanes * most.lane_len).unwrap();
            if resnet && pass == Pass::GradInput {
                assert_eq!(t.lanes, MAX_LANES, "{g:?}: {t:?}");
                assert!(t.units > MAX_LANES && t.chunks > 1, "{g:?}: {t:?}");
            }
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            for threads in [1, 2, 3, 16] {
                let pool = crate::cpu::par::pool_of(threads);
                for len in lens {
                    let got = pool.install(|| {
                        let mut ws = vec![f32::NAN; len];
                        let out = if pass == Pass::Forward {
                            let mut y = vec![f32::NAN; g.y_len()];
                            forward(&g, &x, &w, &mut y, &mut ws).map(|_| y)
                        } else {
                            let mut dx = vec![f32::NAN; g.x_len()];
                            grad_input(&g, &dy, &w, &mut dx, &mut ws).map(|_| dx)
                        };
                        out.unwrap()
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<u32>>()
                    });
                    assert!(
                        got == want,
                        "{g:?} {pass:?}: {threads} threads in {len} elements differ"
                    );
                }
            }
        }
    }
}

/// A tile's lane is never larger than the lane of the block of images it is cut from, so
/// every workspace a forward or input-gradient pass in blocks accepts (the plan's, unchanged)
/// holds at least one lane of tiles, and the lanes fit in it.
#[test]
fn every_workspace_of_blocks_of_images_holds_a_lane_of_tiles() {
    let mut gs = geometries();
    for (side, ch) in [(8, 64), (4, 128), (2, 256)] {
        gs.push(
            ConvGeometry::new(
                [128, ch, side, side],
                [ch, ch, 3, 3],
                [1, 1],
                [1, 1],
                [1, 1],
                1,
            )
            .unwrap(),
        );
    }
    for g in gs.iter().filter(|g| one_tap::live_tap(g).is_none()) {
        for pass in [Pass::Forward, Pass::GradInput] {
            for len in lengths(g, pass) {
                let s = split::<f32>(g, pass, len).unwrap();
                if s.images < 2 {
                    continue;
                }
                let avail = s.lanes * s.lane_len;
                let t = tiles::<f32>(g, pass, s.images, avail);
                let t = t.unwrap_or_else(|| panic!("{g:?} {pass:?} in {len}: no tile fits"));
                assert!(
                    t.lanes >= 1 && t.lanes * t.len <= avail,
                    "{g:?} {pass:?}: {t:?}"
                );
                assert!(t.images <= s.images && t.units >= t.lanes, "{g:?}: {t:?}");
            }
        }
    }
}
