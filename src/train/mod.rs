//! train (to be built).
