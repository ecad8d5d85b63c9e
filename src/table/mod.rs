//! table (to be built).
