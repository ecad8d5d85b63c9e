//! rlcr's CPU kernels on Flex tensors (plain, and `Autodiff<Flex>` as custom `Backward` ops).
//! Each entry returns `None` where it does not apply (another dtype or layout, a switch off, a
//! CPU without the kernels); [`super::super::ops`] then runs burn's composite.
pub mod attention;
pub mod decode;
pub mod fused;
pub mod head;
pub mod sgemm;

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::{DType, Tensor};

/// A contiguous f32 copy (or the tensor itself when it already is one); `None` for another dtype.
fn contiguous(t: FlexTensor) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 {
        return None;
    }
    Some(if t.is_contiguous() {
        t
    } else {
        t.to_contiguous()
    })
}

/// The [`contiguous`] f32 primitive of a plain Flex tensor; `None` on another device (an
/// autodiff one included) or for another dtype.
fn flex_f32<const D: usize>(t: &Tensor<D>) -> Option<FlexTensor> {
    contiguous(t.clone().try_into_primitive::<Flex>().ok()?)
}

/// The values of a contiguous f32 tensor.
fn slice(t: &FlexTensor) -> &[f32] {
    let off = t.layout().start_offset();
    let n = t.layout().shape().num_elements();
    &t.storage::<f32>()[off..off + n]
}
