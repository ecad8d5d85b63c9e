
mod sample;
