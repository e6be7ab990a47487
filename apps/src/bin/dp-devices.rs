//! `dp-devices`: lists the RDMA devices the `rdma` provider can open, with the state, active
//! MTU and GID table size of the chosen port of each.
//!
//! When there is none it prints the one sentence saying why (libibverbs missing, kernel without
//! RDMA support, no device) and exits with status 1.

use clap::Parser;
use dataplane::rdma::{list_devices, Rdma, RdmaConfig};
use dataplane::{Context, Provider};

#[derive(Parser, Debug)]
#[command(about = "List RDMA devices (rdma provider), or say clearly why there are none")]
struct Args {
    /// Port to report for each device.
    #[arg(short = 'p', long, default_value_t = 1)]
    port: u8,
    /// Only list names and GUIDs; do not open the devices.
    #[arg(short = 'l', long)]
    list_only: bool,
}

fn main() {
    dataplane_apps::logging::init();
    let args = Args::parse();
    let devices = match list_devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("dp-devices: {e}");
            std::process::exit(1);
        }
    };
    for d in devices {
        let guid = d.guid;
        print!(
            "{:<12} guid {:04x}:{:04x}:{:04x}:{:04x}",
            d.name,
            guid >> 48,
            (guid >> 32) & 0xffff,
            (guid >> 16) & 0xffff,
            guid & 0xffff
        );
        if args.list_only {
            println!();
            continue;
        }
        let cfg = RdmaConfig { device: Some(d.name.clone()), port: args.port, gid_index: 0 };
        match Rdma::open(&cfg).and_then(|ctx| ctx.port_attr(args.port).map(|pa| (ctx.caps(), pa))) {
            Ok((caps, pa)) => println!(
                "  port {} {:?} mtu {} gids {} max_qp {} max_qp_wr {} max_sge {} max_inline {}",
                args.port,
                pa.state,
                pa.active_mtu,
                pa.gid_tbl_len,
                caps.max_qp,
                caps.max_qp_wr,
                caps.max_sge,
                caps.max_inline_data
            ),
            Err(e) => println!("  {e}"),
        }
    }
}
