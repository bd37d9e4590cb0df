//! Bindings of `tiermem-core`, file for file: the manager (and its recorder), policies
//! written in Python with the mechanism API they get, the 2LM model, calibration and
//! measurement, and the Criteo reader.

pub mod calib;
pub mod criteo;
pub mod hpc;
pub mod manager;
pub mod model;
pub mod pattern;
pub mod policy;
pub mod traits;
