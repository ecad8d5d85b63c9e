
mod model;
