//! Library part of the `dataplane` binaries: the pipeline runner that turns a
//! [`dataplane_config::Config`] into pinned [`dataplane::worker::Worker`]s, runs them and
//! reports, and the live stats that `dpctl` reads while it runs.

#![warn(missing_docs)]

pub mod cli;
pub mod exchange;
pub mod json;
pub mod limits;
pub mod logging;
pub mod packet;
pub mod report;
pub mod runner;
pub mod signals;
pub mod stages;
pub mod stats;
