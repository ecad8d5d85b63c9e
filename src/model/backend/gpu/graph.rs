//! Fixed input buffers refreshed in place, and a sequence of launches captured once and replayed,
//! through cubecl's graph API (`Client::graph_prepare`, `start_capture`, `stop_capture`,
//! `Graph::replay`, and `Client::write` for the inputs), which burn's `capture` wraps with a
//! closure the graph must own; [`crate::model::graph::DecodeGraph`] owns its buffers instead.
//!
//! What a replay is depends on the runtime: on CUDA a hardware graph, one dispatch for the whole
//! step; on wgpu a software graph, the recorded dispatches re-encoded from state resolved once
//! (pipelines, bind groups, the kernels' metadata), so the host's launch path is skipped but
//! every dispatch is still encoded. Both bake what a launch resolves at capture: shapes, strides,
//! scalar arguments and buffer addresses. Whatever moves between steps must therefore live in a
//! buffer the capture read, refreshed with [`write_f32`] / [`write_ids`] between replays
//! (writes are refused inside the capture window); no buffer the graph touches may be
//! reallocated while it lives.
use anyhow::{anyhow, ensure, Result};
use burn::cubecl;
use burn::tensor::{DType, Int, Tensor as BurnTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::Cube;
use cubecl::bytes::Bytes;
use cubecl::client::Graph;

use crate::model::transfer;

/// `p` when it is a contiguous tensor at the start of its buffer (what an in-place write of all
/// of it from the host needs; the buffer may be padded past its end).
fn whole(p: Result<CubeTensor, impl std::fmt::Debug>) -> Result<CubeTensor> {
    let p = p.map_err(|e| anyhow!("internal: a fixed buffer off the GPU: {e:?}"))?;
    let bytes = p.meta.shape().num_elements() * p.dtype.size();
    ensure!(
        p.is_contiguous() && bytes as u64 <= p.handle.size_in_used(),
        "internal: a fixed buffer that is a view of a larger one"
    );
    Ok(p)
}

/// Write `bytes` over the whole tensor `p` (in place: the same device address), counted as
/// an upload ([`transfer::count_write`]).
fn write(p: &CubeTensor, bytes: Vec<u8>) -> Result<()> {
    let size = p.meta.shape().num_elements() * p.dtype.size();
    ensure!(
        bytes.len() == size,
        "internal: {} bytes for a tensor of {size}",
        bytes.len()
    );
    transfer::count_write(bytes.len() as u64);
    p.client.write(&p.handle, Bytes::from_bytes_vec(bytes));
    Ok(())
}

/// Overwrite the f32 tensor `t` (a contiguous buffer of its own) with `values`, in place.
pub fn write_f32<const D: usize>(t: &BurnTensor<D>, values: &[f32]) -> Result<()> {
    let p = whole(t.clone().try_into_primitive::<Cube>())?;
    ensure!(
        p.dtype == DType::F32,
        "internal: an f32 write into {:?}",
        p.dtype
    );
    write(&p, values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// Overwrite the integer tensor `t` (a contiguous buffer of its own, of the backend's integer
/// type) with `values`, in place.
pub fn write_ids(t: &BurnTensor<1, Int>, values: &[i32]) -> Result<()> {
    let p = whole(t.clone().try_into_primitive::<Cube>())?;
    let bytes: Vec<u8> = match p.dtype {
        DType::I32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::I64 => values
            .iter()
            .flat_map(|&v| i64::from(v).to_le_bytes())
            .collect(),
        DType::U32 => values
            .iter()
            .flat_map(|&v| (v as u32).to_le_bytes())
            .collect(),
        other => anyhow::bail!("internal: ids of dtype {other:?}"),
    };
    write(&p, bytes)
}

/// A captured sequence of launches ([`capture`]), replayed against the buffers it was captured
/// with.
pub struct StepGraph {
    graph: Graph,
}

impl std::fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepGraph")
            .field("graph", &self.graph)
            .finish()
    }
}

/// Capture the launches of `step` on the device of `like` into a graph. The pool is prepared
/// (`Client::graph_prepare`); `step` runs eagerly twice (it compiles every kernel, and the
/// second run's buffers, dropped, are what the recording takes from the pool instead of
/// allocating); then once inside the capture window, where its launches are recorded and not
/// run. Returns the first run's output, the recorded run's (the buffers every replay writes)
/// and the graph. `step` must issue the same launches on the same buffers each time, with no
/// read, write or sync (each makes the capture fail here), and give the same results when run
/// again on what it wrote (the warm-up runs the real step twice). An error from `step` ends the
/// capture and is returned.
pub fn capture<R>(
    like: &BurnTensor<1>,
    mut step: impl FnMut() -> Result<R>,
) -> Result<(R, R, StepGraph)> {
    let client = whole(like.clone().try_into_primitive::<Cube>())?.client;
    client
        .graph_prepare()
        .map_err(|e| anyhow!("preparing a graph capture: {e}"))?;
    let warm = step().and_then(|first| step().map(|_| first));
    let first = match warm {
        Ok(first) => first,
        Err(e) => {
            // Closing a prepared capture unwinds it, leaving the stream as it was.
            let _ = client.stop_capture();
            return Err(e);
        }
    };
    // Wait until the warm-up has run on the device: a buffer still in flight is not the pool's
    // to hand out, and inside the window the pool may not add a page (lavapipe under load
    // refused the recording "no room for 0 bytes ... no page may be added" without this wait).
    if let Err(e) = cubecl::future::block_on(client.sync()) {
        let _ = client.stop_capture();
        return Err(anyhow!("waiting for a graph capture's warm-up: {e}"));
    }
    client
        .start_capture()
        .map_err(|e| anyhow!("starting a graph capture: {e}"))?;
    let recorded = step();
    let graph = client.stop_capture();
    let recorded = recorded?;
    let graph = graph.map_err(|e| anyhow!("capturing the decode step: {e}"))?;
    Ok((first, recorded, StepGraph { graph }))
}

impl StepGraph {
    /// Run the recorded launches again, on the buffers they were captured with (enqueued; a
    /// read of an output waits for it).
    ///
    /// # Safety
    /// Every buffer the recording read or wrote is still allocated and not shared with work on
    /// another stream; inputs were refreshed on this thread's stream ([`write_f32`],
    /// [`write_ids`]) and outputs are read on it.
    pub unsafe fn replay(&self) -> Result<()> {
        // Safety: forwarded from this method's contract.
        unsafe { self.graph.replay() }.map_err(|e| anyhow!("replaying the decode step: {e}"))
    }
}
