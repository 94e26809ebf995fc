#!/usr/bin/env python3
"""Writes fuzz/seeds/: one valid packet per opcode of the table (a few
payload lengths each), with the ICRC for the harness's FUZZ_CTX_V4
(10.0.0.1 -> 10.0.0.2, UDP 0xc000 -> 4791, IPv4 ID 0, DF). Coverage alone
does not tell opcodes apart (the codec is table-driven), so the fuzzer is
given every one to start from. Also fuzz/seeds_frame/ for the parse_frame
target: the same packets in Ethernet/IPv4/UDP frames and in raw IPv6/UDP
frames (fd00::1 -> fd00::2), behind the target's link-type selector byte.
Re-run after changing the opcode table."""
import os
import struct
import zlib

# opcode: (extension header bytes, carries payload)
OPCODES = {
    0x00: (0, True), 0x01: (0, True), 0x02: (0, True), 0x03: (4, True),
    0x04: (0, True), 0x05: (4, True), 0x06: (16, True), 0x07: (0, True),
    0x08: (0, True), 0x09: (4, True), 0x0A: (16, True), 0x0B: (20, True),
    0x0C: (16, False), 0x0D: (4, True), 0x0E: (0, True), 0x0F: (4, True),
    0x10: (4, True), 0x11: (4, False), 0x12: (12, False), 0x13: (28, False),
    0x14: (28, False), 0x16: (4, True), 0x17: (4, True),
    0x20: (0, True), 0x21: (0, True), 0x22: (0, True), 0x23: (4, True),
    0x24: (0, True), 0x25: (4, True), 0x26: (16, True), 0x27: (0, True),
    0x28: (0, True), 0x29: (4, True), 0x2A: (16, True), 0x2B: (20, True),
    0x64: (8, True), 0x65: (12, True), 0x81: (16, False),
}


def icrc_v4(udp_payload, src=bytes([10, 0, 0, 1]), dst=bytes([10, 0, 0, 2]),
            sport=0xC000, dport=4791, ident=0, flags=0x4000):
    udp_len = 8 + len(udp_payload)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0xFF, 20 + udp_len, ident,
                               flags, 0xFF, 17, 0xFFFF, src, dst))
    udp = struct.pack("!HHHH", sport, dport, udp_len, 0xFFFF)
    bth = bytearray(udp_payload[:12])
    bth[4] = 0xFF
    data = b"\xff" * 8 + bytes(ip) + udp + bytes(bth) + udp_payload[12:-4]
    return zlib.crc32(data) & 0xFFFFFFFF


def icrc_v6(udp_payload, sport=0xC000, dport=4791):
    udp_len = 8 + len(udp_payload)
    src = bytes.fromhex("fd00" + "00" * 13 + "01")
    dst = bytes.fromhex("fd00" + "00" * 13 + "02")
    ip = b"\x6f\xff\xff\xff" + struct.pack("!HBB", udp_len, 17, 0xFF) + src + dst
    udp = struct.pack("!HHHH", sport, dport, udp_len, 0xFFFF)
    bth = bytearray(udp_payload[:12])
    bth[4] = 0xFF
    data = b"\xff" * 8 + ip + udp + bytes(bth) + udp_payload[12:-4]
    return zlib.crc32(data) & 0xFFFFFFFF


def eth_ipv4_frame(pkt, sport=0xC000, dport=4791):
    udp_len = 8 + len(pkt)
    eth = bytes.fromhex("020000000002" "020000000001" "0800")
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    return eth + ip + struct.pack("!HHHH", sport, dport, udp_len, 0) + pkt


def raw_ipv6_frame(pkt, sport=0xC000, dport=4791):
    udp_len = 8 + len(pkt)
    src = bytes.fromhex("fd00" + "00" * 13 + "01")
    dst = bytes.fromhex("fd00" + "00" * 13 + "02")
    ip = b"\x60\x00\x00\x00" + struct.pack("!HBB", udp_len, 17, 64) + src + dst
    body = pkt[:-4] + struct.pack("<I", icrc_v6(pkt))
    return ip + struct.pack("!HHHH", sport, dport, udp_len, 0) + body


def packet(op, ext_len, payload):
    pad = (4 - len(payload) % 4) % 4
    bth = struct.pack("!BBHBBHBBH", op, 0x80 | (pad << 4), 0xFFFF, 0, 0, 0x11,
                      0x80, 0, 0x42)
    ext = bytes((i * 37 + op) & 0xFF for i in range(ext_len))
    body = bth + ext + payload + b"\0" * pad + b"\0\0\0\0"
    return body[:-4] + struct.pack("<I", icrc_v4(body))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "seeds")
    out_frame = os.path.join(here, "seeds_frame")
    os.makedirs(out, exist_ok=True)
    os.makedirs(out_frame, exist_ok=True)
    for op, (ext_len, has_payload) in OPCODES.items():
        for n in ([0, 1, 3, 8] if has_payload else [0]):
            payload = bytes(range(0xA0, 0xA0 + n))
            pkt = packet(op, ext_len, payload)
            with open(os.path.join(out, f"op{op:02x}_len{n}"), "wb") as f:
                f.write(pkt)
            if n in (0, 3):
                # selector 0: Ethernet; selector 3: raw IP (parse_frame.rs)
                with open(os.path.join(out_frame, f"eth4_op{op:02x}_len{n}"), "wb") as f:
                    f.write(b"\x00" + eth_ipv4_frame(pkt))
                with open(os.path.join(out_frame, f"raw6_op{op:02x}_len{n}"), "wb") as f:
                    f.write(b"\x03" + raw_ipv6_frame(pkt))


if __name__ == "__main__":
    main()
