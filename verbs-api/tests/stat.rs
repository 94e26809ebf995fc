//! `uroce stat`'s source: the state socket of a process, asked through
//! the client `uroce stat --json` uses, against objects made here.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};
use uroce_provider::stat::{self, DeviceState, ProcessState};
use uroce_verbs::{
    Access, CompletionQueue, Device, QpState, QueuePair, SendFlags, SendWr, Wc, WcStatus, WrOpcode,
};

fn wait_one(cq: &CompletionQueue) -> Wc {
    let t = Instant::now();
    loop {
        if let Some(wc) = cq.poll_one() {
            return wc;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no completion");
        std::thread::yield_now();
    }
}

fn write_wr(wr_id: u64, mr: &uroce_verbs::MemoryRegion, len: u32, addr: u64, rkey: u32) -> SendWr {
    let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWrite);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(mr.sge(0, len));
    wr.remote_addr = addr;
    wr.rkey = rkey;
    wr
}

fn device<'a>(p: &'a ProcessState, name: &str) -> &'a DeviceState {
    p.devices
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no device {name} in {p:#?}"))
}

fn qp_of<'a>(d: &'a DeviceState, qp: &QueuePair) -> &'a stat::QpStat {
    d.qps
        .iter()
        .find(|q| q.qpn == qp.qp_num())
        .unwrap_or_else(|| panic!("no QP {:#x} in {:#?}", qp.qp_num(), d.qps))
}

fn counter(d: &DeviceState, name: &str) -> u64 {
    d.counters
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

#[test]
fn the_state_socket_shows_qps_mrs_and_counters() {
    let a = Device::new("stat0", "127.119.0.1".parse().unwrap())
        .open()
        .unwrap();
    let b = Device::new("stat1", "127.119.0.2".parse().unwrap())
        .open()
        .unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let qa = pa.qp_builder(&ca).build().unwrap();
    let qb = pb.qp_builder(&cb).build().unwrap();
    qa.connect(&qb.endpoint()).unwrap();
    qb.connect(&qa.endpoint()).unwrap();
    let src = pa.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = pb
        .alloc_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();

    // A WRITE that succeeds.
    qa.post_send(&[write_wr(1, &src, 3000, dst.sge(0, 0).addr, dst.rkey())])
        .unwrap();
    assert_eq!(wait_one(&ca).status, WcStatus::Success);
    // A second pair whose WRITE names a bad rkey: the requester ends in
    // ERR with a remote access error.
    let qa2 = pa.qp_builder(&ca).build().unwrap();
    let qb2 = pb.qp_builder(&cb).build().unwrap();
    qa2.connect(&qb2.endpoint()).unwrap();
    qb2.connect(&qa2.endpoint()).unwrap();
    let bad = dst.rkey() ^ 0x5a5a_0000;
    qa2.post_send(&[write_wr(0xbad, &src, 8, dst.sge(0, 0).addr, bad)])
        .unwrap();
    assert_eq!(wait_one(&ca).status, WcStatus::RemAccessErr);
    let t = Instant::now();
    while qa2.state() != QpState::Err {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::yield_now();
    }
    // A receive waits on B's first QP; its CQ holds nothing.
    let mut recv = uroce_verbs::RecvWr {
        wr_id: 7,
        sg_list: Default::default(),
    };
    recv.sg_list.push(dst.sge(0, 64));
    qb.post_recv(&[recv]).unwrap();

    let me = stat::query_pid(std::process::id()).unwrap();
    assert_eq!(me.pid, std::process::id());
    let (da, db) = (device(&me, "stat0"), device(&me, "stat1"));
    assert_eq!(da.addr, "127.119.0.1");
    assert_eq!(da.port_state, "ACTIVE");

    // QPs: numbers, states, peers and PSNs as ibv_query_qp gives them.
    let (sa, sb) = (qp_of(da, &qa), qp_of(db, &qb));
    let (aa, ab) = (qa.query().unwrap(), qb.query().unwrap());
    assert_eq!((sa.qp_type.as_str(), sa.state.as_str()), ("RC", "RTS"));
    assert_eq!(sb.state, "RTS");
    assert_eq!((sa.dest_qpn, sb.dest_qpn), (qb.qp_num(), qa.qp_num()));
    assert_eq!(sa.dest_addr.as_deref(), Some("127.119.0.2"));
    assert_eq!((sa.sq_psn, sa.rq_psn), (aa.sq_psn, aa.rq_psn));
    assert_eq!((sb.sq_psn, sb.rq_psn), (ab.sq_psn, ab.rq_psn));
    // The WRITE's packets were sent and are expected no more.
    let n = 3000u32.div_ceil(aa.path_mtu.bytes());
    assert_eq!(sa.path_mtu, aa.path_mtu.bytes());
    assert_eq!(sa.sq_psn, (qa.start_psn() + n) & 0xff_ffff);
    assert_eq!(sb.rq_psn, (qa.start_psn() + n) & 0xff_ffff);
    assert_eq!(
        (sa.sq_wrs, sa.inflight_psns, sa.last_error.as_deref()),
        (0, 0, None)
    );
    assert_eq!((sb.rq_wrs, sb.max_recv_wr), (1, qb.cap().max_recv_wr));
    assert_eq!(sa.pdn, pa.handle());
    let e = qp_of(da, &qa2);
    assert_eq!(e.state, "ERR");
    assert_eq!(e.last_error_status, Some(WcStatus::RemAccessErr as u32));
    assert_eq!(e.last_error_wr_id, Some(0xbad));
    let text = e.last_error.as_deref().unwrap();
    assert!(text.contains("remote access error"), "{text}");

    // MRs: keys, length and rights.
    let m = db.mrs.iter().find(|m| m.rkey == dst.rkey()).unwrap();
    assert_eq!((m.lkey, m.length, m.pdn), (dst.lkey(), 8192, pb.handle()));
    assert_eq!(m.access, ["LOCAL_WRITE", "REMOTE_WRITE"]);
    assert!(da.mrs.iter().any(|m| m.lkey == src.lkey()));
    // PDs, CQs.
    let pd = da.pds.iter().find(|p| p.pdn == pa.handle()).unwrap();
    assert_eq!((pd.mrs, pd.qps), (1, 2));
    let cq = db.cqs.iter().find(|c| c.cqn == cb.handle()).unwrap();
    assert_eq!(cq.pending, 0);
    assert!(cq.cqe >= 16);

    // Counters: B received the WRITE's packets and the bad one, and
    // answered the bad one with a NAK.
    assert_eq!(counter(db, "err_naks_sent"), 1);
    assert!(counter(db, "rcvd_pkts") > u64::from(n));
    assert_eq!(counter(da, "sent_pkts"), a.counters().sent_pkts);
    assert_eq!(da.counters[0].0, "sent_pkts", "declaration order");

    // A destroyed QP leaves the list.
    let gone = qa2.qp_num();
    drop(qa2);
    let me = stat::query_pid(std::process::id()).unwrap();
    assert!(device(&me, "stat0").qps.iter().all(|q| q.qpn != gone));
}

#[test]
fn the_socket_is_the_users_alone_and_answers_one_request() {
    let _ctx = Device::new("stat2", "127.119.0.3".parse().unwrap())
        .open()
        .unwrap();
    let path = stat::socket_of(std::process::id()).expect("a state socket");
    let sock = std::fs::symlink_metadata(&path).unwrap();
    assert_eq!(sock.permissions().mode() & 0o777, 0o600);
    let me = std::fs::metadata("/proc/self").unwrap().uid();
    assert_eq!(sock.uid(), me);
    let dir = std::fs::metadata(path.parent().unwrap()).unwrap();
    assert!(dir.is_dir());
    assert_eq!(dir.permissions().mode() & 0o777, 0o700);

    // Anything but `state` is refused.
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    s.write_all(b"shutdown\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert!(v["error"].as_str().unwrap().contains("state"), "{reply}");
    // The server still answers after it.
    let me = stat::query(&path).unwrap();
    assert!(me.devices.iter().any(|d| d.name == "stat2"));
}

#[test]
fn asking_does_not_keep_a_closed_device_bound() {
    let dev = Device::new("stat3", "127.119.0.4".parse().unwrap());
    let _held = dev.open().unwrap();
    drop(_held);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                stat::query_pid(std::process::id()).unwrap();
                n += 1;
            }
            n
        })
    };
    // Close and open the address again at once, while the state is asked
    // for without pause: the open never finds it bound.
    for _ in 0..200 {
        let ctx = dev.open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4).unwrap();
        let _qp = pd.qp_builder(&cq).build().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(asker.join().unwrap() > 0);
}
