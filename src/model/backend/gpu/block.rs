//! What rlcr's `#[cube]` kernels share: the burn primitive of a tensor, new outputs and buffers
//! written in place, the cube size, a row's coordinates and offsets, and reductions across the
//! units of one cube.
//!
//! The reductions are a tree over shared memory, in a fixed order for a given cube size, so a
//! kernel gives the same bits on every run (no atomics, no plane intrinsics whose order the
//! driver picks). They are called by every unit of the cube together: each `sync_cube` sits in
//! control flow that is the same for all units (loops bounded by the cube size).
use burn::cubecl;
use burn::tensor::{DType, Tensor as BurnTensor};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::prelude::*;

/// Units per cube: 256, or the device's largest power of two below that (the tree reductions
/// halve the cube).
fn units(client: &Client) -> u32 {
    let max = client
        .properties()
        .hardware
        .max_units_per_cube
        .clamp(1, 256);
    if max.is_power_of_two() {
        max
    } else {
        max.next_power_of_two() >> 1
    }
}

/// Units of a cube that works on one row of `width` elements: [`units`], or the smallest power
/// of two that covers a narrower row.
pub fn row_units(client: &Client, width: usize) -> u32 {
    let cover = width.max(1).next_power_of_two().min(1 << 16) as u32;
    units(client).min(cover)
}

/// One cube per row for `n` rows: along x up to the device's limit (wgpu allows 65,535 cubes on
/// an axis, and a prefill can have more rows), the rest along y; [`cube_row`] numbers them.
pub fn row_grid(client: &Client, n: usize) -> CubeCount {
    let max_x = client.properties().hardware.max_cube_count.0.max(1) as usize;
    let x = n.clamp(1, max_x);
    CubeCount::Static(x as u32, n.div_ceil(x) as u32, 1)
}

/// The row of this cube in a [`row_grid`] of `rows` rows. The grid's last cubes, past the
/// rows, stop here (all their units: a barrier after this never waits for a stopped unit).
#[cube]
pub fn cube_row(rows: usize) -> usize {
    let row = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
    if row >= rows {
        terminate!();
    }
    row
}

/// The coordinates `(i, j, k)` of row `row = (i·n + j)·m + k` of a grid of rows laid out
/// `[·, n, m]` row-major (e.g. batch, head and slot of a `[B, n, m]` grid).
#[cube]
pub fn unravel(row: usize, n: usize, m: usize) -> (usize, usize, usize) {
    (row / (n * m), (row / m) % n, row % m)
}

/// The offset of element `[i, j, k, 0]` of a 4-D tensor `t` (any strides).
#[cube]
pub fn offset3<E: CubePrimitive>(t: &Tensor<E>, i: usize, j: usize, k: usize) -> usize {
    i * t.stride(0) + j * t.stride(1) + k * t.stride(2)
}

/// The CubeCL primitive of a plain (non-autodiff) f32 tensor on a GPU, laid out in rows (a
/// matmul's storage-tiled output is un-tiled; a no-op otherwise). `None` on the CPU, for an
/// autodiff tensor or another dtype.
pub fn plain<const D: usize>(t: &BurnTensor<D>) -> Option<CubeTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let p = t.clone().try_into_primitive::<Cube>().ok()?;
    Some(burn_cubecl::kernel::untile(p))
}

/// Runs `f` on the primitive of `t` (a plain f32 tensor on a GPU) for a kernel that writes it in
/// place, and leaves `t` holding that primitive. A buffer that another tensor shares (a clone)
/// is copied first, as burn's own in-place ops do, so that the clone never sees the writes.
/// `None`, with `t` as it was and `f` not run, where [`plain`] gives none.
pub fn in_place<const D: usize, R>(
    t: &mut BurnTensor<D>,
    f: impl FnOnce(&CubeTensor) -> Option<R>,
) -> Option<R> {
    let mut out = None;
    t.inplace(|x| {
        let Some(p) = plain(&x) else { return x };
        // The clone `plain` took is the only holder once `x` is gone.
        drop(x);
        let p = if p.can_mut() && p.is_nonoverlapping() {
            p
        } else {
            p.copy()
        };
        out = f(&p);
        tensor(p)
    });
    out
}

/// A new f32 tensor of `shape` on `like`'s device.
pub fn output(like: &CubeTensor, shape: &[usize]) -> CubeTensor {
    empty_device_dtype(
        like.client.clone(),
        like.device.clone(),
        burn::tensor::Shape::from(shape.to_vec()),
        DType::F32,
    )
}

/// The burn tensor of a kernel's output.
pub fn tensor<const D: usize>(t: CubeTensor) -> BurnTensor<D> {
    BurnTensor::<D>::from_primitive::<Cube>(t)
}

/// How [`block_fold`] combines the units' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fold {
    Sum,
    Max,
    Min,
}

/// `a` and `b` combined by `op`.
#[cube]
fn fold(a: f32, b: f32, #[comptime] op: Fold) -> f32 {
    match op {
        Fold::Sum => a + b,
        Fold::Max => a.max(b),
        Fold::Min => a.min(b),
    }
}

/// Every unit's `x` combined by `op`, returned to every unit: a tree over `red` (at least the
/// cube's size; free again on return). `CUBE_DIM_X` is a power of two.
#[cube]
pub fn block_fold(red: &mut Shared<[f32]>, x: f32, #[comptime] op: Fold) -> f32 {
    let tid = UNIT_POS_X as usize;
    red[tid] = x;
    sync_cube();
    let mut half = (CUBE_DIM_X / 2) as usize;
    while half > 0 {
        if tid < half {
            red[tid] = fold(red[tid], red[tid + half], op);
        }
        sync_cube();
        half /= 2;
    }
    let total = red[0];
    sync_cube();
    total
}

/// The sum of every unit's `x`, returned to every unit ([`block_fold`]).
#[cube]
pub fn block_sum(red: &mut Shared<[f32]>, x: f32) -> f32 {
    block_fold(red, x, Fold::Sum)
}

/// The maximum of every unit's `x`, returned to every unit ([`block_fold`]).
#[cube]
pub fn block_max(red: &mut Shared<[f32]>, x: f32) -> f32 {
    block_fold(red, x, Fold::Max)
}

/// The minimum of every unit's `x`, returned to every unit ([`block_fold`]).
#[cube]
pub fn block_min(red: &mut Shared<[f32]>, x: f32) -> f32 {
    block_fold(red, x, Fold::Min)
}
