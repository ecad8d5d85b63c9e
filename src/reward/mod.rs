//! reward (to be built).
