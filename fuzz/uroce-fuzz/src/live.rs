//! A live target: any RoCEv2 endpoint reachable over UDP 4791, observed
//! through `uroce-fuzz-agent` (fuzz/agent/uroce_fuzz_agent.c) on TCP.
//!
//! The fuzzer's packets leave a UDP socket bound to the fuzzer's own
//! address and port 4791 (where the target answers), with DF and IPv4 ID
//! 0 (IP_PMTUDISC_DO), the header their ICRC is computed for. The
//! fuzzer's address must not be a uroce device's on the same host.

use super::target::{
    Completion, Conn, ExposedKey, KeyKind, KeyState, Observation, Target, TargetError,
};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use uroce_provider::types::{QpState, QpType};

/// A target reached over UDP and observed through its agent.
#[derive(Debug)]
pub struct LiveTarget {
    sock: UdpSocket,
    fuzzer: IpAddr,
    target: IpAddr,
    agent_addr: SocketAddr,
    agent: Option<(BufReader<TcpStream>, TcpStream)>,
    fuzzer_qpn: u32,
    psn: u32,
    /// Time the target gets to settle before it is observed.
    pub settle: Duration,
    /// A raw IPv4 socket for spoofed sends (made at the first).
    raw: Option<socket2::Socket>,
}

/// The fuzzer socket's buffers.
const FUZZ_SOCK_BUF: usize = 4 << 20;

fn io(e: impl std::fmt::Display) -> TargetError {
    TargetError::Io(e.to_string())
}

impl LiveTarget {
    /// Binds `fuzzer`:4791 and connects to the agent at `agent`.
    pub fn new(
        fuzzer: IpAddr,
        target: IpAddr,
        agent: SocketAddr,
    ) -> Result<LiveTarget, TargetError> {
        let s = uroce_provider::sans_io::engine::df_socket(fuzzer).map_err(io)?;
        s.bind(&SocketAddr::new(fuzzer, uroce_wire::ROCEV2_UDP_PORT).into())
            .map_err(|e| io(format!("bind {fuzzer}:4791: {e}")))?;
        // Room for a burst of answers (exhaustion's 256 READ responses of
        // a full MTU): the default buffer drops them before they are read.
        uroce_provider::sans_io::engine::grow_buffers(&s, FUZZ_SOCK_BUF);
        let sock: UdpSocket = s.into();
        let mut t = LiveTarget {
            sock,
            fuzzer,
            target,
            agent_addr: agent,
            agent: None,
            fuzzer_qpn: 0xf00d,
            psn: 0x1234,
            settle: Duration::from_millis(5),
            raw: None,
        };
        t.connect_agent()?;
        Ok(t)
    }

    fn connect_agent(&mut self) -> Result<(), TargetError> {
        let s = TcpStream::connect_timeout(&self.agent_addr, Duration::from_secs(5))
            .map_err(|e| io(format!("agent {}: {e}", self.agent_addr)))?;
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .map_err(io)?;
        s.set_nodelay(true).map_err(io)?;
        let w = s.try_clone().map_err(io)?;
        self.agent = Some((BufReader::new(s), w));
        Ok(())
    }

    fn command(&mut self, cmd: &str) -> Result<Vec<String>, TargetError> {
        let (r, w) = self.agent.as_mut().ok_or_else(|| io("agent gone"))?;
        w.write_all(cmd.as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .map_err(io)?;
        let multi = cmd == "observe";
        let mut lines = Vec::new();
        loop {
            let mut l = String::new();
            if r.read_line(&mut l).map_err(io)? == 0 {
                self.agent = None;
                return Err(io("the agent closed the connection"));
            }
            let l = l.trim_end().to_string();
            let done = !multi || l == "end";
            lines.push(l);
            if done {
                return Ok(lines);
            }
        }
    }
}

fn field(line: &str, name: &str) -> Option<u64> {
    word(line, name).and_then(|v| v.parse().ok())
}

fn word<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// The agent's `keys=` list: `NAME,RKEY,KIND,VA,LEN,ACCESS,SAME_PD,
/// BOUND_TO_QP,STATE` entries separated by `;` (see the agent's header).
/// An entry that does not parse ends the list: the keys after it would
/// not be at their indices.
fn keys(s: &str) -> Vec<ExposedKey> {
    let entry = |e: &str| -> Option<ExposedKey> {
        let f: Vec<&str> = e.split(',').collect();
        let [name, key, kind, va, len, access, same_pd, bound, state] = f[..] else {
            return None;
        };
        let n = |v: &str| v.parse::<u64>().ok();
        Some(ExposedKey {
            name: name.to_string(),
            key: n(key)? as u32,
            kind: match n(kind)? {
                0 => KeyKind::Region,
                1 => KeyKind::Window1,
                2 => KeyKind::Window2,
                _ => return None,
            },
            va: n(va)?,
            len: n(len)? as u32,
            access: n(access)? as u32,
            same_pd: n(same_pd)? != 0,
            bound_to_qp: n(bound)? != 0,
            state: match n(state)? {
                0 => KeyState::Valid,
                1 => KeyState::Deregistered,
                2 => KeyState::Invalidated,
                3 => KeyState::Unbound,
                _ => return None,
            },
        })
    };
    s.split(';').map_while(entry).collect()
}

/// The connection an agent's `setup` answer describes (see the agent's
/// header): fields an older agent does not send (recv_len, access,
/// qp_access, min_rnr_timer, keys) are taken as not known.
/// `ends`: the target's and the fuzzer's addresses, the fuzzer's QP.
fn conn_of(
    l: &str,
    qp_type: QpType,
    ends: (IpAddr, IpAddr, u32),
    recvs: u32,
) -> Result<Conn, TargetError> {
    let (target, fuzzer, fuzzer_qpn) = ends;
    if !l.starts_with("ok ") {
        return Err(io(format!("agent: {l}")));
    }
    let f = |n: &str| field(l, n).ok_or_else(|| io(format!("agent: no {n} in {l}")));
    Ok(Conn {
        qp_type,
        target,
        fuzzer,
        src_port: uroce_wire::ROCEV2_UDP_PORT,
        qpn: f("qpn")? as u32,
        fuzzer_qpn,
        control_qpn: f("control_qpn")? as u32,
        rq_psn: f("rq_psn")? as u32,
        sq_psn: f("sq_psn")? as u32,
        va: f("va")?,
        len: f("len")? as u32,
        rkey: f("rkey")? as u32,
        private_rkey: f("private_rkey")? as u32,
        qkey: f("qkey")? as u32,
        mtu: f("mtu")? as u32,
        recvs_posted: recvs.min(64),
        keys: word(l, "keys").map_or_else(Vec::new, keys),
        recv_len: field(l, "recv_len").map(|v| v as u32),
        min_rnr_timer: field(l, "min_rnr_timer").map(|v| v as u8),
        access: field(l, "access").map(|v| v as u32),
        qp_access: field(l, "qp_access").map(|v| v as u32),
        ops_1_5: field(l, "ops_1_5").map(|v| v as u8),
    })
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

impl Target for LiveTarget {
    fn name(&self) -> String {
        format!("{} (agent {})", self.target, self.agent_addr)
    }

    fn setup(&mut self, qp_type: QpType, recvs: u32) -> Result<Conn, TargetError> {
        if self.agent.is_none() {
            self.connect_agent()?;
        }
        // Old answers are not this case's.
        let _ = self.wait(0);
        self.psn = self.psn.wrapping_mul(1_103_515_245).wrapping_add(12345) & 0xff_ffff;
        let t = match qp_type {
            QpType::Rc => "rc",
            QpType::Uc => "uc",
            QpType::Ud => "ud",
        };
        let cmd = format!(
            "setup {t} {recvs} {} {} {}",
            self.fuzzer, self.fuzzer_qpn, self.psn
        );
        let lines = self.command(&cmd)?;
        let ends = (self.target, self.fuzzer, self.fuzzer_qpn);
        conn_of(&lines[0], qp_type, ends, recvs)
    }

    fn post(&mut self, wr: &super::case::Post) -> Result<(), TargetError> {
        use super::case::PostOp;
        let op = match wr.op {
            PostOp::Send => "send",
            PostOp::Write => "write",
            PostOp::Read => "read",
            PostOp::CompareSwap => "cas",
            PostOp::FetchAdd => "faa",
        };
        let cmd = format!(
            "post {op} {} {} {} {} {} {} {}",
            wr.wr_id, wr.len, wr.local_off, wr.remote_va, wr.rkey, wr.swap_add, wr.compare
        );
        let lines = self.command(&cmd)?;
        match lines.first() {
            Some(l) if l == "ok" => Ok(()),
            l => Err(io(format!("agent: {}", l.map_or("", |l| l.as_str())))),
        }
    }

    fn send(&mut self, packet: &[u8]) {
        let _ = self.sock.send_to(
            packet,
            SocketAddr::new(self.target, uroce_wire::ROCEV2_UDP_PORT),
        );
    }

    fn wait(&mut self, us: u32) -> Vec<Vec<u8>> {
        let end = Instant::now() + Duration::from_micros(u64::from(us));
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let _ = self.sock.set_nonblocking(left.is_zero());
            if !left.is_zero() {
                let _ = self.sock.set_read_timeout(Some(left));
            }
            match self.sock.recv_from(&mut buf) {
                Ok((n, from)) if from.ip() == self.target => out.push(buf[..n].to_vec()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        out
    }

    /// Sends `packet` in an IPv4 datagram from `src` through a raw socket
    /// (needs CAP_NET_RAW); IPv6 is not supported.
    fn send_from(&mut self, src: IpAddr, packet: &[u8]) -> Result<(), TargetError> {
        let (IpAddr::V4(s), IpAddr::V4(d)) = (src, self.target) else {
            return Err(io("spoofed sends are IPv4 only"));
        };
        let dgram = spoofed_datagram(s, d, packet)?;
        if self.raw.is_none() {
            // IPPROTO_RAW implies IP_HDRINCL: the datagram carries its header.
            let proto = socket2::Protocol::from(libc::IPPROTO_RAW);
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(proto))
                .map_err(|e| io(format!("raw socket (needs CAP_NET_RAW): {e}")))?;
            self.raw = Some(sock);
        }
        let raw = self.raw.as_ref().ok_or_else(|| io("no raw socket"))?;
        raw.send_to(&dgram, &SocketAddr::new(self.target, 0).into())
            .map_err(|e| io(format!("spoofed send from {src}: {e}")))?;
        Ok(())
    }

    fn observe(&mut self) -> Result<Observation, TargetError> {
        std::thread::sleep(self.settle);
        let lines = match self.command("observe") {
            Ok(l) => l,
            Err(e) => return Ok(Observation::dead(vec![e.to_string()])),
        };
        let mut o = Observation {
            alive: true,
            qp_state: QpState::Err,
            completions: Vec::new(),
            events: Vec::new(),
            exposed: Vec::new(),
            private_intact: false,
            control_ok: false,
            log: Vec::new(),
            answers: None,
        };
        for l in &lines {
            let (word, rest) = l.split_once(' ').unwrap_or((l, ""));
            match word {
                "state" => {
                    o.qp_state = rest
                        .trim()
                        .parse()
                        .ok()
                        .and_then(QpState::from_u32)
                        .unwrap_or(QpState::Err)
                }
                "wc" => {
                    let v: Vec<u64> = rest
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    if let Some(c) = completion(&v) {
                        o.completions.push(c);
                    }
                }
                "event" => o.events.push(rest.to_string()),
                "exposed" => o.exposed = hex(rest.trim()),
                "private" => o.private_intact = rest.trim() == "ok",
                "control" => o.control_ok = rest.trim() == "ok",
                "log" => o.log.push(rest.to_string()),
                "error" => return Err(io(format!("agent: {l}"))),
                _ => {}
            }
        }
        Ok(o)
    }
}

/// A completion from the numbers of the agent's `wc` line: `WR_ID STATUS
/// RECV`, then (agents that report them) `OPCODE BYTE_LEN WC_FLAGS IMM
/// INVALIDATED_RKEY SRC_QP`; the details kept only of a successful one,
/// the immediate and the invalidated key only where the flags say
/// (`IBV_WC_WITH_IMM` 2, `IBV_WC_WITH_INV` 8).
fn completion(v: &[u64]) -> Option<Completion> {
    let [wr_id, status, recv, ref more @ ..] = *v else {
        return None;
    };
    let mut c = Completion {
        wr_id,
        status: status as u32,
        recv: recv != 0,
        ..Completion::default()
    };
    if let ([opcode, byte_len, flags, imm, inv, src_qp, ..], 0) = (more, status) {
        c.opcode = Some(*opcode as u32);
        c.byte_len = Some(*byte_len as u32);
        c.imm = (flags & 2 != 0).then_some(*imm as u32);
        c.invalidated_rkey = (flags & 8 != 0).then_some(*inv as u32);
        c.src_qp = (c.recv && *src_qp != 0).then_some(*src_qp as u32);
    }
    Some(c)
}

/// An IPv4 datagram from `src` to `dst` around the RoCEv2 `packet`, with
/// the header a UDP socket's packet has and the fuzzer's ICRCs are
/// computed for: DF, ID 0 (the kernel keeps 0 when DF is set), TTL 64,
/// UDP ports 4791 and checksum 0.
pub fn spoofed_datagram(
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    packet: &[u8],
) -> Result<Vec<u8>, TargetError> {
    use uroce_wire::frame::{build_frame, FrameParams, ETH_HDR_LEN};
    let port = uroce_wire::ROCEV2_UDP_PORT;
    let p = FrameParams {
        udp_checksum: false,
        ..FrameParams::v4([0; 6], [0; 6], src, dst, 0, port)
    };
    let mut buf = vec![0u8; p.frame_len(packet.len())];
    let n = build_frame(&p, packet, &mut buf).map_err(io)?;
    buf.truncate(n);
    buf.drain(..ETH_HDR_LEN);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's keys list parses into the table, in order; a broken
    /// entry ends it.
    #[test]
    fn the_agents_keys_parse() {
        let l = "ok qpn=17 keys=read-only,4660,0,140000,1024,4,1,1,0;\
                 window2-invalidated,291,2,8192,256,14,1,0,2;bad,1 x=1";
        let k = keys(word(l, "keys").expect("keys"));
        assert_eq!(k.len(), 2);
        assert_eq!(
            k[1],
            ExposedKey {
                name: "window2-invalidated".into(),
                key: 291,
                kind: KeyKind::Window2,
                va: 8192,
                len: 256,
                access: 14,
                same_pd: true,
                bound_to_qp: false,
                state: KeyState::Invalidated,
            }
        );
        assert_eq!(k[0].kind, KeyKind::Region);
        assert!(keys("").is_empty());
    }

    /// The agent's setup answer carries the QP's min_rnr_timer and access
    /// flags and the region's; an older agent's, without them, leaves
    /// them unknown.
    #[test]
    fn the_setup_answer_parses_old_and_new() {
        let ends = (
            "127.115.0.1".parse().expect("ip"),
            "127.115.0.2".parse().expect("ip"),
            0xf00d,
        );
        let old = "ok qpn=17 control_qpn=18 rq_psn=5 sq_psn=6 va=4096 len=4096 rkey=7 \
                   private_rkey=8 qkey=286331153 mtu=1024 recv_len=4096 keys=";
        let c = conn_of(old, QpType::Rc, ends, 8).expect("parses");
        assert_eq!((c.qpn, c.sq_psn, c.recv_len), (17, 6, Some(4096)));
        assert_eq!((c.min_rnr_timer, c.access, c.qp_access), (None, None, None));
        assert_eq!(c.ops_1_5, None);
        let new = "ok qpn=17 control_qpn=18 rq_psn=5 sq_psn=6 va=4096 len=4096 rkey=7 \
                   private_rkey=8 qkey=286331153 mtu=1024 recv_len=4096 access=15 \
                   qp_access=15 min_rnr_timer=1 ops_1_5=1 keys=";
        let c = conn_of(new, QpType::Rc, ends, 8).expect("parses");
        assert_eq!(
            (c.min_rnr_timer, c.access, c.qp_access),
            (Some(1), Some(15), Some(15))
        );
        assert_eq!(c.ops_1_5, Some(crate::target::OPS_FLUSH));
        assert!(conn_of("error modify: x", QpType::Rc, ends, 8).is_err());
    }

    /// Live (`UROCE_FUZZ_LIVE=TARGET_IP,FUZZER_IP,AGENT_ADDR`, an agent
    /// running there): the agent says its QP's min_rnr_timer, a SEND
    /// with no receive WR draws an RNR NAK carrying it, and the model
    /// judges the timer (another one in `Conn` is a violation).
    #[test]
    #[ignore = "needs a live agent"]
    fn live_rnr_nak_timer_is_judged() {
        use crate::case::{Case, PacketSpec, Step};
        use crate::model::{judge, Verdict};
        let Ok(v) = std::env::var("UROCE_FUZZ_LIVE") else {
            return;
        };
        let [target, fuzzer, agent] = v.split(',').collect::<Vec<_>>()[..] else {
            panic!("UROCE_FUZZ_LIVE=TARGET_IP,FUZZER_IP,AGENT_ADDR");
        };
        let mut t = LiveTarget::new(
            fuzzer.parse().expect("ip"),
            target.parse().expect("ip"),
            agent.parse().expect("addr"),
        )
        .expect("agent");
        let mut send = PacketSpec::new(uroce_wire::Opcode::RC_SEND_ONLY, 0);
        send.payload = (8, 1);
        let case = Case {
            steps: vec![Step::Packet(send), Step::Wait(20_000)],
        };
        let out = crate::run_case(&mut t, QpType::Rc, 0, &case).expect("runs");
        let timer = out.conn.min_rnr_timer.expect("the agent says its timer");
        let rnr = out
            .obs
            .answers
            .iter()
            .flatten()
            .filter_map(|b| crate::model::answer::Seen::parse(b))
            .find_map(|s| match s {
                crate::model::answer::Seen::Rnr { timer, .. } => Some(timer),
                _ => None,
            });
        assert_eq!(rnr, Some(timer));
        assert_eq!(judge(&out.conn, &case, &out.obs), Verdict::Legal);
        let other = Conn {
            min_rnr_timer: Some((timer + 1) & 0x1f),
            ..out.conn.clone()
        };
        assert!(matches!(
            judge(&other, &case, &out.obs),
            Verdict::Illegal(_)
        ));
    }

    /// The agent's `wc` lines: the old three numbers, and the details of a
    /// successful receive (immediate and invalidated key only where the
    /// flags say; nothing of a failed one).
    #[test]
    fn wc_lines_parse_with_and_without_details() {
        let old = completion(&[7, 5, 1]).expect("parses");
        assert_eq!((old.wr_id, old.status, old.recv), (7, 5, true));
        assert_eq!(old.opcode, None);
        let c = completion(&[3, 0, 1, 129, 200, 2, 0xabcd, 0xabcd, 0x77]).expect("parses");
        assert_eq!(c.opcode, Some(129));
        assert_eq!(c.byte_len, Some(200));
        assert_eq!(c.imm, Some(0xabcd));
        assert_eq!(c.invalidated_rkey, None);
        assert_eq!(c.src_qp, Some(0x77));
        let failed = completion(&[3, 9, 1, 129, 200, 2, 1, 1, 1]).expect("parses");
        assert_eq!((failed.opcode, failed.imm), (None, None));
        assert!(completion(&[1, 2]).is_none());
    }
}
