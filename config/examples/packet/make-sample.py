#!/usr/bin/env python3
"""Writes sample.pcap, the capture that config/examples/packet/pcap-acl.toml replays: twelve
frames chosen so that each rule of its `acl` stage, its default, and each of two malformed
cases in its `parse` stage are hit. The expected outcome per frame is in the comments and in
apps/tests/packet_pipeline.rs. Run: python3 make-sample.py (writes next to itself)."""
import os
import struct

A = bytes.fromhex("020000000a01")   # host in 10.1.0.0/24
R = bytes.fromhex("0200000000a1")   # the filter's side of the wire
BCAST = b"\xff" * 6


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def ipv4(src, dst, proto, payload, frag=0, bad_csum=False):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, frag, 64, proto, 0, bytes(src), bytes(dst))
    c = csum(h) ^ (0x1234 if bad_csum else 0)
    return h[:10] + struct.pack("!H", c) + h[12:] + payload


def udp(sport, dport, data=b"dataplane"):
    return struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data


def tcp_syn(sport, dport):
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 0x50, 0x02, 65535, 0, 0)


def eth(dst, src, ether_type, payload, vlan=None):
    tag = struct.pack("!HH", 0x8100, vlan) if vlan is not None else b""
    return dst + src + tag + struct.pack("!H", ether_type) + payload


H1, H2, BAD = [10, 1, 0, 2], [10, 2, 0, 9], [10, 1, 0, 66]
V6A = bytes.fromhex("fe800000000000000000000000000001")
V6B = bytes.fromhex("fe800000000000000000000000000002")
frames = [
    eth(R, A, 0x0800, ipv4(H1, H2, 17, udp(40000, 5000))),                 # pass: rule 1
    eth(R, A, 0x0800, ipv4(H1, H2, 17, udp(40000, 5999))),                 # pass: rule 1
    eth(R, A, 0x0800, ipv4(H1, H2, 17, udp(40000, 6000))),                 # drop: no rule
    eth(R, A, 0x0800, ipv4(BAD, H2, 17, udp(40000, 5000))),                # drop: rule 0
    eth(R, A, 0x0800, ipv4(H1, H2, 6, tcp_syn(33000, 80))),                # pass: rule 2
    eth(BCAST, A, 0x0806, bytes.fromhex("0001080006040001") + A + bytes(H1) + bytes(6) + bytes(H2)),  # pass: rule 3
    eth(R, A, 0x86DD, struct.pack("!IHBB", 0x60000000, 17, 17, 64) + V6A + V6B + udp(40000, 5000)),  # pass: rule 4
    eth(R, A, 0x0800, ipv4(H1, H2, 1, bytes.fromhex("0800f7fe00010000"))),  # drop: no rule (ICMP)
    eth(R, A, 0x0800, ipv4(H1, H2, 17, udp(40000, 5000), bad_csum=True)),  # malformed: IPv4 checksum
    eth(R, A, 0x0800, ipv4(H1, H2, 6, tcp_syn(33000, 80)[:12])),           # malformed: TCP cut short
    eth(R, A, 0x0800, ipv4(H1, H2, 17, udp(40000, 5001)), vlan=7),         # pass: rule 1 (VLAN 7)
    eth(R, A, 0x0800, ipv4(H1, H2, 17, b"later fragment", frag=0x0010)),   # drop: no ports, no rule
]

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sample.pcap")
with open(out, "wb") as f:
    f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for i, fr in enumerate(frames):
        f.write(struct.pack("<IIII", 1764000000 + i, 0, len(fr), len(fr)))
        f.write(fr)
print(f"{out}: {len(frames)} frames")
