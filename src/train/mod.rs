//! Training (phase 1: pure loss math, optimizer, schedule).
pub mod loss;
pub mod optim;
pub mod schedule;
pub mod tensor;
