//! The provider-neutral verbs model: work requests, completions, opcodes, flags, QP types and
//! states, capabilities and errno-carrying errors.
//!
//! It follows rdma-core's man pages (`ibv_post_send(3)`, `ibv_post_recv(3)`,
//! `ibv_post_srq_recv(3)`, `ibv_post_srq_ops(3)`) field by field; docs/conformance.md maps
//! each sentence of those pages to the test that checks it.

mod access;
mod connect;
mod device;
mod error;
mod flow;
mod opcode;
mod qp;
mod srq;
mod tm;
mod wc;
mod wr;

pub use access::AccessFlags;
pub use connect::{ConnectOpts, PeerAddr, MCAST_QPN};
pub use device::{AsyncEvent, AsyncEventKind, DeviceCaps, PortAttr, PortState};
pub use error::{Errno, Error, PostError, Result};
pub use flow::{FlowId, FlowSpec};
pub use opcode::{WcOpcode, WrOpcode};
pub use qp::{ack_timeout_ns, rnr_timer_ns, AhAttr, Endpoint, QpAttr, QpCaps, QpState, QpType};
pub use srq::{SrqAttr, SrqAttrMask};
pub use tm::{OpsChain, OpsFlags, OpsOpcode, OpsWr, TmCaps, Tmh, TmhOp, TMH_LEN};
pub use wc::{WcFlags, WcStatus, WorkCompletion};
pub use wr::{inc_rkey, AhHandle, MwBind, MwBindInfo, RecvChain, RecvWr, SendChain, SendFlags, SendWr, Sge, UdDest};

/// Size of the Global Routing Header area at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;
