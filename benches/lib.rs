//! Benchmarks live in [[bench]] targets; this holds what they share.

/// The packets the wire benchmarks parse and build: RC_RDMA_WRITE_ONLY
/// (BTH + RETH) between 10.0.0.1 and 10.0.0.2.
pub mod wire {
    use core::net::Ipv4Addr;
    use uroce_wire::icrc::{IpContext, IpFields, IPV4_DF};
    use uroce_wire::packet::{self, Headers};
    use uroce_wire::{BthRepr, Opcode, Psn, RethRepr};

    pub const SIZES: [usize; 3] = [64, 1024, 4096];
    pub const SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    pub const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    pub const SPORT: u16 = 0xc123;

    pub fn headers(len: usize) -> Headers {
        let mut h = Headers::new(BthRepr {
            opcode: Opcode::RC_RDMA_WRITE_ONLY,
            pkey: 0xffff,
            dest_qp: 0x11,
            psn: Psn::new(0x1234),
            ack_req: true,
            ..BthRepr::default()
        });
        h.reth = Some(RethRepr {
            va: 0x7f00_0000_1000,
            rkey: 0x1234_5678,
            dma_len: len as u32,
        });
        h
    }

    pub fn payload(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + 7) as u8).collect()
    }

    /// The engine's own IPv4 header: ID 0, DF.
    pub fn known_ctx() -> IpContext {
        IpContext::for_socket_v4(SRC, DST, SPORT, uroce_wire::ROCEV2_UDP_PORT)
    }

    /// A sender that uses a non-zero IPv4 ID (as kernel rxe does).
    pub fn rxe_ctx() -> IpContext {
        IpContext {
            ip: IpFields::V4 {
                src: SRC,
                dst: DST,
                ident: 0xb7e3,
                flags_frag: IPV4_DF,
            },
            ..known_ctx()
        }
    }

    pub fn build(len: usize, ctx: &IpContext) -> Vec<u8> {
        let h = headers(len);
        let mut buf = vec![0u8; packet::packet_len(&h, len).unwrap()];
        packet::emit(&h, &payload(len), &mut buf, ctx).unwrap();
        buf
    }

    /// Bytes the ICRC of a `len`-byte packet covers (8 LRH + 20 IPv4 + 8
    /// UDP + the packet less its ICRC): the yardstick hashes this many.
    pub fn covered_len(packet_len: usize) -> usize {
        8 + 20 + 8 + packet_len - 4
    }
}
