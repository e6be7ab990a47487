//! The pipeline against the device's limits, checked once the provider is open and before
//! anything is created: a value the device cannot do is an error that points at the field
//! (`file:line:column`), rather than an `EINVAL` from deep in bring-up; `max_inline` above the
//! device's is lowered to it (the schema documents that clamp) with a note.

use dataplane::shm::sizing;
use dataplane::verbs::DeviceCaps;
use dataplane_config::{ByteSize, Config, ConfigError, ErrorKind, Located, ProviderKind, StageKind, Transport};

/// What the pipeline may use on this device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fit {
    /// `max_inline` of each QP (in `cfg.qps` order), at most the device's.
    pub max_inline: Vec<u32>,
    /// One sentence per value that was lowered.
    pub notes: Vec<String>,
}

/// Checks `cfg` against `caps` and the port's active MTU (`mtu`, bytes) of `device` (a label
/// for messages: `device rxe0`).
/// Errors: one line per value the device cannot do, each naming the field and its location.
pub fn fit(cfg: &Config, caps: &DeviceCaps, mtu: u32, device: &str) -> Result<Fit, String> {
    let mut errors = Vec::new();
    let mut over = |field: String, value: &Located<u32>, cap: &str, max: u32, hint: &str| {
        if **value > max {
            let msg = format!("{} is above what {device} supports ({cap} = {max})", **value);
            errors.push(
                ConfigError::new(ErrorKind::Resource, &cfg.source, value.span.clone(), field, msg).with_hint(hint),
            );
        }
    };
    for (i, w) in cfg.workers.iter().enumerate() {
        over(
            format!("workers[{i}].cq_depth"),
            &w.cq_depth,
            "max_cqe",
            caps.max_cqe,
            "lower cq_depth (and the queues it must hold)",
        );
        over(format!("workers[{i}].srq_depth"), &w.srq_depth, "max_srq_wr", caps.max_srq_wr, "lower srq_depth");
    }
    let mut fit = Fit::default();
    for (j, q) in cfg.qps.iter().enumerate() {
        over(format!("qps[{j}].send_depth"), &q.send_depth, "max_qp_wr", caps.max_qp_wr, "lower send_depth");
        if !*q.use_srq {
            over(format!("qps[{j}].recv_depth"), &q.recv_depth, "max_qp_wr", caps.max_qp_wr, "lower recv_depth");
        }
        let inline = (*q.max_inline).min(caps.max_inline_data);
        if inline < *q.max_inline {
            fit.notes.push(format!(
                "qp {}: max_inline {} lowered to {inline}, the most {device} sends inline",
                q.name, *q.max_inline
            ));
        }
        fit.max_inline.push(inline);
    }
    let counts = [
        ("QPs", cfg.qps.len(), caps.max_qp, "max_qp"),
        ("CQs (two per worker)", 2 * cfg.workers.len(), caps.max_cq, "max_cq"),
        ("SRQs (one per worker)", cfg.workers.len(), caps.max_srq, "max_srq"),
    ];
    for (what, n, max, cap) in counts {
        if n as u64 > u64::from(max) {
            let msg = format!("the pipeline needs {n} {what} but {device} has at most {max} ({cap})");
            errors.push(ConfigError::new(ErrorKind::Resource, &cfg.source, None, "", msg));
        }
    }
    // A UD message is at most the path MTU: check sources sending straight to a UD QP.
    for (i, s) in cfg.stages.iter().enumerate() {
        if *s.kind != StageKind::Source {
            continue;
        }
        let ud = s.output.as_ref().and_then(|o| cfg.qp(o)).filter(|q| *q.transport == Transport::Ud);
        if let Some(q) = ud {
            if s.message_size.bytes() > u64::from(mtu) {
                let msg = format!(
                    "message_size {} is larger than the MTU of {device}'s port ({mtu} bytes), the limit of a UD message on qp `{}`",
                    *s.message_size, q.name
                );
                let span = s.message_size.span.clone().or_else(|| s.name.span.clone());
                errors.push(
                    ConfigError::new(ErrorKind::Resource, &cfg.source, span, format!("stages[{i}].message_size"), msg)
                        .with_hint("lower message_size, or use transport = \"rc\""),
                );
            }
        }
    }
    if errors.is_empty() {
        Ok(fit)
    } else {
        let lines: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
        Err(format!("{device} cannot run this pipeline as configured:\n{}", lines.join("\n")))
    }
}

/// Room the shm fabric of a run has besides `fabric_size` and the pools (the tables take about
/// 2 MiB of it).
const SHM_FABRIC_SLACK: u64 = 4 << 20;

/// Bytes of the region a pool of `buffer_size` x `count` takes (64-byte buffers, realigned).
fn pool_region_bytes(buffer_size: u64, count: u64) -> u64 {
    buffer_size.div_ceil(64).saturating_mul(64).saturating_mul(count).saturating_add(64)
}

/// The size of the shm fabric `dataplane run` creates for `cfg`: `fabric_size` for the rings,
/// plus each pool's memory (and a page), plus `SHM_FABRIC_SLACK`. The runner and
/// [`check_shm`] must use the same figure.
pub fn shm_fabric_bytes(cfg: &Config) -> u64 {
    let pools = cfg.memory.pools.iter().fold(0u64, |acc, p| acc.saturating_add(p.bytes()).saturating_add(4096));
    cfg.provider.fabric_size.bytes().saturating_add(pools).saturating_add(SHM_FABRIC_SLACK)
}

/// The least the fabric must hold for `cfg`: its tables, the pools' regions, each worker's
/// two CQs (the receive CQ without a message queue: `Context::create_cq_sender_side`) and
/// SRQ, and the receive queues of the QPs with one of their own (`use_srq = false`; UD and
/// RAW_PACKET rings have twice the cells, as an SRQ's). A lower bound: a run may need a
/// little more, never less.
fn shm_fabric_need(cfg: &Config) -> u64 {
    let pools = cfg
        .memory
        .pools
        .iter()
        .map(|p| sizing::alloc_bytes(pool_region_bytes(p.buffer_size.bytes(), u64::from(*p.count))));
    let queues = cfg.workers.iter().map(|w| {
        let cqs = sizing::cq_bytes(*w.cq_depth).saturating_add(sizing::cq_ring_bytes(*w.cq_depth));
        cqs.saturating_add(sizing::srq_bytes(*w.srq_depth, 1))
    });
    let rqs = cfg.qps.iter().filter(|q| !*q.use_srq).map(|q| match *q.transport {
        Transport::Rc => sizing::recv_queue_bytes(*q.recv_depth, 1),
        Transport::Ud | Transport::RawPacket => sizing::unconnected_recv_queue_bytes(*q.recv_depth, 1),
    });
    pools.chain(queues).chain(rqs).fold(sizing::tables_bytes(), u64::saturating_add)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// Checks `cfg` against the shm device before anything is opened (`dataplane check`): the
/// device's limits ([`fit`]) and whether the rings and pools fit the fabric `dataplane run`
/// would create ([`shm_fabric_bytes`]); the latter error names `provider.fabric_size` and the
/// size needed. Other providers: nothing to check without the device.
pub fn check_shm(cfg: &Config) -> Result<(), String> {
    if *cfg.provider.kind != ProviderKind::Shm {
        return Ok(());
    }
    let size = shm_fabric_bytes(cfg);
    fit(cfg, &sizing::caps(size), sizing::port_mtu(), "the shm device")?;
    let need = shm_fabric_need(cfg);
    if need > size {
        let fs = &cfg.provider.fabric_size;
        let want = fs.bytes().saturating_add(need - size).next_multiple_of(1 << 20);
        let msg = format!(
            "fabric_size {} is too small: the fabric must hold {} of rings, tables and pools but would have {}",
            **fs,
            mib(need),
            mib(size)
        );
        let hint = format!(
            "set fabric_size = \"{}\" or more, or lower the workers' cq_depth and srq_depth (a worker's send CQ takes 192 bytes an entry, its CQE and its message-queue cell; its receive CQ 64, the CQE)",
            ByteSize(want)
        );
        let e = ConfigError::new(ErrorKind::Resource, &cfg.source, fs.span.clone(), "provider.fabric_size", msg)
            .with_hint(hint);
        return Err(format!("the shm device cannot run this pipeline as configured:\n  {e}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIPELINE: &str = r#"
[[workers]]
name = "w"
core = 0
cq_depth = 8192

[[qps]]
name = "a"
worker = "w"
peer = "b"
max_inline = 256

[[qps]]
name = "b"
worker = "w"
peer = "a"
send_depth = 40000

[[stages]]
name = "src"
worker = "w"
kind = "source"
output = "a"

[[stages]]
name = "sink"
worker = "w"
kind = "sink"
input = "b"
"#;

    fn caps() -> DeviceCaps {
        DeviceCaps {
            max_qp: 64,
            max_qp_wr: 16384,
            max_cq: 64,
            max_cqe: 32768,
            max_srq: 64,
            max_srq_wr: 16384,
            max_inline_data: 64,
            ..Default::default()
        }
    }

    #[test]
    fn depth_above_the_device_is_an_error_at_its_field() {
        let cfg = Config::from_str(PIPELINE, "p.toml").unwrap();
        let e = fit(&cfg, &caps(), 1024, "device rxe0").unwrap_err();
        assert_eq!(
            e,
            "device rxe0 cannot run this pipeline as configured:\n  p.toml:17:14: qps[1].send_depth: 40000 is above what device rxe0 supports (max_qp_wr = 16384); hint: lower send_depth"
        );
    }

    #[test]
    fn max_inline_is_lowered_with_a_note() {
        let cfg = Config::from_str(&PIPELINE.replace("send_depth = 40000", "send_depth = 128"), "p.toml").unwrap();
        let f = fit(&cfg, &caps(), 1024, "device rxe0").unwrap();
        assert_eq!(f.max_inline, [64, 64]);
        assert_eq!(f.notes, ["qp a: max_inline 256 lowered to 64, the most device rxe0 sends inline"]);
    }

    #[test]
    fn ud_message_above_the_mtu_is_an_error() {
        let text = PIPELINE
            .replace("send_depth = 40000", "transport = \"ud\"")
            .replace("peer = \"b\"\nmax_inline = 256", "peer = \"b\"\ntransport = \"ud\"")
            .replace("output = \"a\"", "output = \"a\"\nmessage_size = 2048");
        let cfg = Config::from_str(&text, "p.toml").unwrap();
        let e = fit(&cfg, &caps(), 1024, "device rxe0").unwrap_err();
        assert!(e.contains("p.toml:24:16: stages[0].message_size: message_size 2K is larger than the MTU of device rxe0's port (1024 bytes)"), "{e}");
    }
}
