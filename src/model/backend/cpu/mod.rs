//! rlcr's CPU kernels on Flex tensors (plain, and `Autodiff<Flex>` as custom `Backward` ops).
//! Each entry returns `None` where it does not apply (another dtype or layout, a switch off, a
//! CPU without the kernels); [`super::super::ops`] then runs burn's composite.
pub mod attention;
pub mod decode;
pub mod fused;
pub mod head;
pub mod sgemm;
