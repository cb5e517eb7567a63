//! GPU placement: fit, score and policies. To be written with the scheduler.
pub mod frag;
