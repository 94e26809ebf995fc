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

/// Two loopback devices with RC QPs between them, and the SEND/RECV
/// ping-pong the RC benchmarks time.
pub mod rc {
    use std::net::IpAddr;
    use uroce_verbs::loopback::{connect_rc, RcParams};
    use uroce_verbs::*;

    /// Every access right.
    pub const ALL: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_ATOMIC);

    /// One side: a device, a PD, one CQ for everything and an RC QP on it.
    pub struct End {
        pub ctx: Context,
        pub pd: ProtectionDomain,
        pub cq: CompletionQueue,
        pub qp: QueuePair,
    }

    /// Opens a device on `ip` with one RC QP.
    pub fn end(ip: &str) -> End {
        let ctx = Device::new("bench", ip.parse().unwrap())
            .open()
            .expect("open");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4096).unwrap();
        let qp = pd.create_qp(&qp_init(&cq)).unwrap();
        End { ctx, pd, cq, qp }
    }

    impl End {
        /// Another PD, CQ and RC QP on the same device.
        pub fn another(&self) -> End {
            let ctx = self.ctx.clone();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(4096).unwrap();
            let qp = pd.create_qp(&qp_init(&cq)).unwrap();
            End { ctx, pd, cq, qp }
        }
    }

    /// An RC QP with both queues on `cq`.
    pub fn qp_init(cq: &CompletionQueue) -> QpInitAttr<'_> {
        QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        }
    }

    /// Connects `qa` (on `ai`) and `qb` (on `bi`) to each other at MTU
    /// 4096; a sends from PSN `psn_a`, b from `psn_b`.
    pub fn connect(qa: &QueuePair, ai: IpAddr, qb: &QueuePair, bi: IpAddr, psn_a: u32, psn_b: u32) {
        let p = RcParams {
            mtu: Mtu::Mtu4096,
            ..RcParams::default()
        };
        connect_rc(qa, bi, qb.qp_num(), psn_a, psn_b, p).unwrap();
        connect_rc(qb, ai, qa.qp_num(), psn_b, psn_a, p).unwrap();
    }

    /// Waits for one completion, which must be a success.
    pub fn wait1(cq: &CompletionQueue) {
        loop {
            if let Some(wc) = cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success);
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Waits for a receive completion, skipping send completions.
    pub fn wait_recv(cq: &CompletionQueue) {
        loop {
            match cq.poll_one() {
                Some(wc) if wc.opcode == WcOpcode::Recv => return,
                Some(_) => {}
                None => std::thread::yield_now(),
            }
        }
    }

    /// One SEND/RECV round trip of `size` bytes from a to b and back
    /// (`ma`, `mb`: their buffers).
    pub fn pingpong_once(a: &End, b: &End, ma: &MemoryRegion, mb: &MemoryRegion, size: usize) {
        b.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: [mb.sge(0, size as u32)].into_iter().collect(),
        }])
        .unwrap();
        a.qp.post_recv(&[RecvWr {
            wr_id: 2,
            sg_list: [ma.sge(0, size as u32)].into_iter().collect(),
        }])
        .unwrap();
        let mut w = SendWr::new(3, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(ma.sge(0, size as u32));
        a.qp.post_send(&[w.clone()]).unwrap();
        // b: receive, then answer
        wait_recv(&b.cq);
        w.sg_list[0] = mb.sge(0, size as u32);
        b.qp.post_send(&[w]).unwrap();
        wait_recv(&a.cq);
    }
}
