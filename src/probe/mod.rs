//! probe (to be built).
