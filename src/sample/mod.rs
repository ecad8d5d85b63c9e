//! sample (to be built).
