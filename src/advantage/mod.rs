//! advantage (to be built).
