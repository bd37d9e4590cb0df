//! Bindings of `tiermem-core`, file for file: the manager (and its recorder), policies
//! written in Python with the mechanism API they get, the 2LM model, calibration and
//! measurement.

pub mod calib;
pub mod manager;
pub mod model;
pub mod policy;
pub mod traits;
