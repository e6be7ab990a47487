//! The packet parsers: a frame from the wire (an xdp RX descriptor, a RAW_PACKET receive)
//! through every reader of `dataplane::net`: the frame key (steering), software IP checksums
//! (IBV_SEND_IP_CSUM), a TSO plan with the frame as its header template, and the IPv4
//! router's forwarding step, the checked header parse of the `parse` and `acl` stages, and
//! the pcap file reader of `pcap-reader`. Any bytes: no panic, no read past the frame, the
//! router either forwards (TTL one less, header checksum still valid) or changes nothing, a
//! parse that succeeds has its headers inside the frame, and a pcap file that reads has its
//! records inside the file.
#![no_main]

use dataplane::net::{checksum, frame, headers, pcap, route, tso};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let k = frame::FrameKey::parse(data);
    if let Some(l4) = k.l4 {
        assert!(l4 <= data.len() && k.l3.is_some_and(|l3| l3 < l4));
    }
    let mut f = data.to_vec();
    frame::fill_ip_checksums(&mut f);
    if let Ok(plan) = tso::TsoPlan::new(data, 1448, 65536) {
        let mut out = vec![0u8; plan.header_len() + 1448];
        for i in [0, plan.frames() - 1] {
            let n = plan.write_frame(data, i, &mut out);
            assert!(n <= out.len());
        }
    }
    let table = route::Table::new(vec![
        route::Route { prefix: [10, 0, 0, 0], len: 8, output: 1, next_hop_mac: [2, 0, 0, 0, 0, 1], src_mac: [2; 6] },
        route::Route { prefix: [0; 4], len: 0, output: 0, next_hop_mac: [2, 0, 0, 0, 0, 2], src_mac: [2; 6] },
    ]);
    let mut f = data.to_vec();
    match route::forward(&table, &mut f) {
        Ok(out) => {
            assert!(out <= 1);
            assert_eq!(f[22], data[22] - 1, "TTL decremented");
            let ihl = usize::from(f[14] & 0x0f) * 4;
            assert_eq!(checksum::finish(checksum::accumulate(0, &f[14..14 + ihl])), 0, "header checksum valid");
        }
        Err(_) => assert_eq!(f, data, "a dropped frame is unchanged"),
    }
    if let Ok(h) = headers::Headers::parse(data, true) {
        assert!(h.l3 <= data.len());
        if h.transport != headers::Transport::None {
            assert!(h.l3 < h.l4 && h.l4 + 4 <= data.len(), "a transport header inside the frame");
        }
        // The stages' two calls agree: verifying the checksum only refuses more.
        assert_eq!(headers::Headers::parse(data, false), Ok(h));
    }
    if let Ok(file) = pcap::PcapFile::parse(data) {
        let bytes: usize = file.records().iter().map(|r| 16 + file.frame(r).len()).sum();
        assert_eq!(24 + bytes, data.len(), "records tile the file");
    }
});
