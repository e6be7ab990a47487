//! `dp-pingpong --xrc`: rdma-core's `ibv_xsrq_pingpong`, with its exchange, so either side can
//! be rdma-core's program on a device with XRC.
//!
//! Each process opens the XRC domain of `/tmp/xrc_domain` (shared by every process on the
//! host that opens it), one XRC SRQ in it, and per client an XRC_RECV QP (the target of the
//! peer's sends) and an XRC_SEND QP (ours). The server takes `--clients` connections one after
//! the other; each side tells the other its two QPNs, a PSN and its SRQ number (66-byte
//! messages, [`conn::XrcEndpoint`]). The server sends first to every client; every receive
//! answers with a send to its client, naming the client's SRQ, until each client has had
//! `-n` messages. As in `ibv_xsrq_pingpong`, the message for client `i` travels on the QP of
//! client `(i + count) % clients`: with several clients, XRC_RECV QPs deliver into SRQs of other
//! processes of their domain. Then `END` messages close the run.

use super::{gid_str, Args, Device};
use dataplane::conn::{self, XrcEndpoint};
use dataplane::verbs::*;
use dataplane::{Context, Cq, Mr, Pd, Qp, QpInitAttr, Srq, Xrcd};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Instant;

/// The file whose inode names the XRC domain (`ibv_xsrq_pingpong`'s).
const DOMAIN_FILE: &str = "/tmp/xrc_domain";

fn print_dest(what: &str, d: &XrcEndpoint) {
    println!(
        "{what:>8}: LID {:04x}, QPN RECV {:06x} SEND {:06x}, PSN {:06x}, SRQN {:06x}, GID {}",
        d.lid,
        d.recv_qpn,
        d.send_qpn,
        d.psn,
        d.srqn,
        gid_str(&d.gid)
    );
}

/// Runs the XRC pingpong (`a.xrc`).
pub fn run<P: Device>(a: &Args) -> Result<()> {
    let clients = if a.server.is_some() { 1 } else { a.clients.max(1) as usize };
    let tests = a.iters;
    if a.size == 0 || tests == 0 {
        return Err(Error::new(Errno::EINVAL, "size and iters must be > 0"));
    }
    let ctx = P::open_dev(a)?;
    let pd = ctx.alloc_pd()?;
    let region = ctx.alloc_region(a.size as usize)?;
    let mr = pd.reg_mr(&region, 0, a.size as usize, AccessFlags::LOCAL_WRITE)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CREAT)
        .mode(0o440)
        .open(DOMAIN_FILE)
        .map_err(|e| Error::new(Errno::EIO, format!("cannot open {DOMAIN_FILE} for the XRC domain: {e}")))?;
    let xrcd = ctx.open_xrcd_file(&file)?;
    let (mut recv_cq, channel) = if a.events {
        let (mut cq, ch) = P::cq_with_channel(&ctx, clients as u32)?;
        cq.req_notify(false)?;
        (cq, Some(ch))
    } else {
        (ctx.create_cq(clients as u32)?, None)
    };
    let mut send_cq = ctx.create_cq(clients as u32)?;
    let mut srq = pd.create_srq_xrc(&SrqAttr { max_wr: clients as u32, max_sge: 1, srq_limit: 0 }, &xrcd, &recv_cq)?;
    let init = ConnectOpts { port_num: a.ib_port, ..Default::default() };
    let mut recv_qps = Vec::with_capacity(clients);
    let mut send_qps = Vec::with_capacity(clients);
    let depth = u32::try_from(clients as u64 * tests)
        .ok()
        .filter(|&d| d <= ctx.caps().max_qp_wr)
        .ok_or_else(|| Error::new(Errno::EINVAL, "clients x iters is above the device's max_qp_wr"))?;
    for _ in 0..clients {
        let mut r = xrcd.create_recv_qp()?;
        r.bring_up_to_init(&ConnectOpts { access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ, ..init })?;
        recv_qps.push(r);
        let mut s = pd.create_qp(&QpInitAttr {
            send_cq: &send_cq,
            recv_cq: &send_cq,
            srq: None,
            cap: QpCaps { max_send_wr: depth, max_recv_wr: 0, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            qp_type: QpType::XrcSend,
            sq_sig_all: false,
        })?;
        s.bring_up_to_init(&init)?;
        send_qps.push(s);
    }
    let recv = RecvChain::one(0, &[Sge::new(mr.addr(), a.size, mr.lkey())]);
    let post_recv = |srq: &mut P::Srq, n: usize| -> Result<()> {
        for _ in 0..n {
            srq.post_recv(&recv).map_err(|e| Error::new(e.errno, format!("post_srq_recv: {e}")))?;
        }
        Ok(())
    };
    post_recv(&mut srq, clients)?;

    let gid = if a.gid_idx > 0 || P::NAME == "shm" { ctx.gid(a.ib_port, a.gid_idx)? } else { [0; 16] };
    let lid = ctx.port_attr(a.ib_port)?.lid;
    let base_psn = std::process::id() & 0xff_ffff;
    let mut remotes = vec![XrcEndpoint::default(); clients];
    let mut socks: Vec<TcpStream> = Vec::with_capacity(clients);
    let connect = |recv: &mut P::Qp, send: &mut P::Qp, local: &XrcEndpoint, r: &XrcEndpoint| -> Result<()> {
        let ah = AhAttr {
            dlid: r.lid,
            is_global: r.gid != [0; 16],
            dgid: r.gid,
            sgid_index: a.gid_idx,
            hop_limit: 5,
            port_num: a.ib_port,
            ..Default::default()
        };
        let opts = ConnectOpts { port_num: a.ib_port, path_mtu: a.mtu, sq_psn: local.psn, ..Default::default() };
        recv.connect(&PeerAddr { qpn: r.send_qpn, psn: r.psn, ah }, &opts)?;
        send.connect(&PeerAddr { qpn: r.recv_qpn, psn: r.psn, ah }, &opts)
    };
    match &a.server {
        Some(host) => {
            let mut s = conn::connect_stream(host, a.port)?;
            let local = XrcEndpoint {
                lid,
                recv_qpn: recv_qps[0].qp_num(),
                send_qpn: send_qps[0].qp_num(),
                psn: base_psn,
                srqn: srq.srq_num(),
                gid,
            };
            print_dest("local", &local);
            conn::write_xrc(&mut s, &local)?;
            remotes[0] = conn::read_xrc(&mut s)?;
            print_dest("remote", &remotes[0]);
            connect(&mut recv_qps[0], &mut send_qps[0], &local, &remotes[0])?;
            socks.push(s);
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", a.port))
                .map_err(|e| Error::new(Errno::EIO, format!("cannot listen on port {}: {e}", a.port)))?;
            for i in 0..clients {
                let (mut s, _) =
                    l.accept().map_err(|e| Error::new(Errno::EIO, format!("accepting client {i}: {e}")))?;
                remotes[i] = conn::read_xrc(&mut s)?;
                print_dest("remote", &remotes[i]);
                let local = XrcEndpoint {
                    lid,
                    recv_qpn: recv_qps[i].qp_num(),
                    send_qpn: send_qps[i].qp_num(),
                    psn: (base_psn + i as u32 * 0x1000) & 0xff_ffff,
                    srqn: srq.srq_num(),
                    gid,
                };
                print_dest("local", &local);
                conn::write_xrc(&mut s, &local)?;
                connect(&mut recv_qps[i], &mut send_qps[i], &local, &remotes[i])?;
                socks.push(s);
            }
        }
    }

    // Message `pp_cnt[i]` for client `i` goes out on the QP of client `(i + pp_cnt[i]) %
    // clients`, naming client i's SRQ; the last one to each client is signaled.
    let mut pp_cnt = vec![0u64; clients];
    let sge = Sge::new(mr.addr(), a.size, mr.lkey());
    let post_send = |i: usize, pp_cnt: &mut Vec<u64>, send_qps: &mut Vec<P::Qp>| -> Result<()> {
        let qpi = ((i as u64 + pp_cnt[i]) % clients as u64) as usize;
        pp_cnt[i] += 1;
        let mut wr = SendWr::send(i as u64).xrc_srqn(remotes[i].srqn);
        if pp_cnt[i] >= tests {
            wr = wr.signaled();
        }
        send_qps[qpi].post_send(&SendChain::one(wr, &[sge])).map_err(|e| Error::new(e.errno, format!("post_send: {e}")))
    };
    let start = Instant::now();
    if a.server.is_none() {
        for i in 0..clients {
            post_send(i, &mut pp_cnt, &mut send_qps)?;
        }
    }
    let total = clients as u64 * tests;
    let mut cnt = 0u64;
    let mut wc = [WorkCompletion::default(); 1];
    while cnt < total {
        if let Some(ch) = &channel {
            P::wait_event(ch)?;
            recv_cq.req_notify(false)?;
        }
        loop {
            let n = recv_cq.poll(&mut wc)?;
            if n == 0 {
                break;
            }
            let w = wc[0];
            if w.status != WcStatus::Success {
                return Err(Error::new(Errno::EIO, format!("work completion error: {}", w.status.as_str())));
            }
            post_recv(&mut srq, 1)?;
            let qpi = if clients == 1 {
                0
            } else {
                recv_qps.iter().position(|q| q.qp_num() == w.qp_num).ok_or_else(|| {
                    Error::new(Errno::EIO, format!("receive completion for unknown QP {:#x}", w.qp_num))
                })?
            };
            if pp_cnt[qpi] < tests {
                post_send(qpi, &mut pp_cnt, &mut send_qps)?;
            }
            cnt += 1;
        }
    }
    // The last send to each client is signaled: wait for those.
    let mut done = 0;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while done < clients {
        match send_cq.poll(&mut wc)? {
            0 if Instant::now() > deadline => {
                return Err(Error::new(Errno::ETIMEDOUT, "the last sends did not complete within 60 s"));
            }
            0 => std::thread::yield_now(),
            _ if wc[0].status != WcStatus::Success => {
                return Err(Error::new(Errno::EIO, format!("send completion error: {}", wc[0].status.as_str())));
            }
            n => done += n,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // A process closes its resources only once its peers said END: their last messages may
    // still be on their way into its SRQ (the comment in ibv_xsrq_pingpong).
    if a.server.is_some() {
        conn::write_end(&mut socks[0])?;
        conn::read_end(&mut socks[0])?;
    } else {
        for s in socks.iter_mut() {
            conn::read_end(s)?;
        }
        for s in socks.iter_mut() {
            conn::write_end(s)?;
        }
    }
    println!("{total} messages in {secs:.2} seconds = {:.2} usec/message", secs * 1e6 / total as f64);
    drop(send_qps);
    drop(recv_qps);
    println!("success");
    Ok(())
}
