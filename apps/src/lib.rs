//! Library part of the `dataplane` binaries: the pipeline runner that turns a
//! [`dataplane_config::Config`] into pinned [`dataplane::worker::Worker`]s, runs them and
//! reports.

#![warn(missing_docs)]

pub mod report;
pub mod runner;
