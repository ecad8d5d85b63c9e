//! Integration tests (one binary).
mod score;
