#!/usr/bin/env python3
"""Generate scapy_roce.pcap: RoCEv2 packets whose ICRC scapy computed.

Independent evidence for uroce-wire's ICRC, pcap reader and frame codec:
wire/tests/scapy_vectors.rs reads the capture, checks every ICRC exactly,
recovers the IPv4 IDs with icrc::verify_unknown_ipv4_id, and rebuilds every
frame byte for byte with frame::build_roce_frame.

NOT run by CI: the pcap is committed. It was generated once with scapy
2.8.0 (scapy >= 2.6 is needed for the IPv6 ICRC), e.g. with the venv that
shared/roce-check/check_pcap installs:

    ~/.cache/roce-check/venv/bin/python wire/tests/data/gen_scapy.py

scapy.contrib.roce has layers for the BTH, AETH (ACKNOWLEDGE only) and the
CNP; the other extension headers are packed by hand below (IBA vol. 1
9.3). scapy's BTH computes the ICRC over the IP/UDP headers it builds.
"""
import os
import struct
import sys

from scapy.all import Ether, IP, IPv6, UDP, Raw, wrpcap
from scapy.contrib.roce import BTH, AETH, cnp


def reth(va, rkey, dma_len):
    return struct.pack("!QII", va, rkey, dma_len)


def aeth(syndrome, msn):
    return struct.pack("!I", syndrome << 24 | msn)


def deth(qkey, src_qp):
    return struct.pack("!II", qkey, src_qp & 0xFFFFFF)


def imm(v):
    return struct.pack("!I", v)


def padded(payload):
    pad = (4 - len(payload) % 4) % 4
    return payload + b"\0" * pad, pad


ETH = Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:0b")


def v4(**kw):
    return ETH / IP(src="192.168.10.1", dst="192.168.10.2", **kw)


def v6(**kw):
    return ETH / IPv6(src="fd00::a", dst="fd00::b", **kw)


def main():
    pkts = []

    # 1. IPv4 RC SEND_ONLY, 3 bytes + 1 pad: shared/roce-check/ICRC.md
    #    example 1 (TOS 0x6a, TTL 1, DF, ID 0xec3b, UDP checksum 0).
    pkts.append(v4(tos=0x6A, ttl=1, flags="DF", id=0xEC3B)
                / UDP(sport=0xC113, dport=4791, chksum=0)
                / BTH(opcode=0x04, migreq=1, padcount=1, pkey=0x8001,
                      dqpn=0x1D3A6A, ackreq=1, psn=0x1B4B3D)
                / Raw(b"\xdd\xe4\xeb\x00"))

    # 2. IPv4 RC RDMA_WRITE_FIRST, no DF, ID 0x1234, TOS 0x02, TTL 64,
    #    UDP checksum computed by scapy.
    pkts.append(v4(tos=0x02, ttl=64, flags=0, id=0x1234)
                / UDP(sport=0xC0DE, dport=4791)
                / BTH(opcode=0x06, migreq=1, dqpn=0x000012, psn=100)
                / Raw(reth(0x00007F3A2C401000, 0x8F3A17C5, 4096) + bytes(range(16))))

    # 3. IPv4 RC ACKNOWLEDGE as kernel rxe sends it: DF, ID from the
    #    kernel's generator, UDP checksum 0.
    pkts.append(v4(flags="DF", id=0xC105, ttl=64)
                / UDP(sport=0xD3A2, dport=4791, chksum=0)
                / BTH(opcode=0x11, dqpn=0x000011, psn=100)
                / AETH(syndrome=0x1F, msn=1))

    # 4. IPv4 UD SEND_ONLY_WITH_IMMEDIATE, 6 bytes + 2 pad, ID 0xffff,
    #    ECN CE in the TOS (masked), SE.
    body, pad = padded(b"abcdef")
    pkts.append(v4(tos=0xB8 | 0x3, ttl=17, flags="DF", id=0xFFFF)
                / UDP(sport=0xC0DF, dport=4791)
                / BTH(opcode=0x65, solicited=1, padcount=pad, dqpn=0x000013, psn=7)
                / Raw(deth(0x11111111, 0x000011) + imm(0xCAFEF00D) + body))

    # 5. IPv4 CNP (BECN), ID 0x8001.
    pkts.append(v4(flags="DF", id=0x8001, ttl=64)
                / UDP(sport=0xD3A2, dport=4791)
                / cnp(0x000011))

    # 6. IPv6 RC SEND_ONLY, 5 bytes + 3 pad: TC 0x68, flow label 0xcc1de,
    #    hop limit 255 (all masked).
    body, pad = padded(b"hello")
    pkts.append(v6(tc=0x68, fl=0xCC1DE, hlim=255)
                / UDP(sport=0xC113, dport=4791)
                / BTH(opcode=0x04, migreq=1, padcount=pad, dqpn=0x1D3A6A,
                      ackreq=1, psn=0x1B4B3E)
                / Raw(body))

    # 7. IPv6 RC RDMA_READ_RESPONSE_ONLY: AETH + 7 bytes + 1 pad.
    body, pad = padded(bytes(range(0x40, 0x47)))
    pkts.append(v6(tc=0, fl=0, hlim=64)
                / UDP(sport=0xD3A2, dport=4791)
                / BTH(opcode=0x10, migreq=1, padcount=pad, dqpn=0x000011, psn=0xFFFFFF)
                / Raw(aeth(0x1F, 0x00ABCD) + body))

    # 8. IPv6 UD SEND_ONLY: DETH + 2 bytes + 2 pad.
    body, pad = padded(b"\x01\x02")
    pkts.append(v6(tc=0x02, fl=0x12345, hlim=1)
                / UDP(sport=0xC0DF, dport=4791)
                / BTH(opcode=0x64, padcount=pad, dqpn=0x000013, psn=8)
                / Raw(deth(0x11111111, 0x000011) + body))

    # 9. IPv6 CNP.
    pkts.append(v6(tc=0x68, fl=0, hlim=64)
                / UDP(sport=0xD3A2, dport=4791)
                / cnp(0x000011))

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scapy_roce.pcap")
    for i, p in enumerate(pkts, 1):
        p.time = 1700000000 + i
    wrpcap(out, pkts)
    print("wrote %d packets to %s" % (len(pkts), out), file=sys.stderr)


if __name__ == "__main__":
    main()
