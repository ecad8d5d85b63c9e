//! A decode step that replays: for a fixed batch and cache capacity, the step's inputs live in
//! buffers allocated once and written in place, and its launches (every layer, the LM head and
//! the draw) are captured once and replayed every later step ([`DecodeGraph`]). On CUDA a replay
//! is one dispatch instead of a launch per kernel, each costing host time; on wgpu the graph is
//! cubecl's software graph (see [`super::backend::gpu::graph`]), the same rules, run on lavapipe
//! in the tests.
//!
//! Design decisions:
//! - **Nothing that moves is baked in.** A capture freezes shapes, strides, scalar arguments and
//!   buffer addresses. What changes from step to step lives in three buffers written before each
//!   step: the token ids (`[B]`), the slot description (`[1 + B]`: the step's slot, then each
//!   row's RoPE position, −1 for a row that takes no token), and the draw's uniforms and row map
//!   (`[2, B]`). The RoPE + cache-write and attention kernels read the slot from there; the draw's
//!   settings and the attention scale are fixed for the graph's life.
//! - **Fixed shapes.** The cache's capacity is reserved when the graph is made and never grows
//!   ([`DecodeGraph::room`] says how many steps are left): attention's shared memory and grid
//!   depend on it. A row that finishes stays in the batch as padding (no position, its slot
//!   flagged empty, its query seeing only itself), so the other rows compute what they would
//!   without it. Growing the cache, selecting rows and copying a shared buffer happen between
//!   graphs: one graph per batch size and capacity.
//! - **Capture on the first step.** The first step runs eagerly twice, the second identical to
//!   the first (the same inputs write the same values into the same slot), which compiles the
//!   kernels and leaves the pool holding every buffer the recording takes; then the recording,
//!   whose launches do not run. Every later step writes its inputs and replays.
//! - **Eager mode** runs the same launches on the same buffers without a capture: the reference
//!   a replay is tested against bit for bit.
//! - **Liveness.** A replay writes the buffers the capture saw, so the graph owns them: the
//!   cache (moved in, handed back by [`DecodeGraph::into_cache`]), a clone of the model (its
//!   weights), the input buffers and the recorded outputs.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod step;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use step::{DecodeGraph, StepOutput};

/// Whether a [`DecodeGraph`] captures its step and replays it, or runs it eagerly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphMode {
    /// Every step launches its kernels.
    Eager,
    /// The first step is captured; every later one replays it.
    Replay,
}
