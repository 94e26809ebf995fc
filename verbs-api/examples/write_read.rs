//! One-sided RDMA on uroce's Rust API: a client WRITEs into a server's
//! region, READs it back, and counts with atomic fetch-and-add, while the
//! server's CPU does nothing but wait (one-sided operations complete only
//! at the initiator).
//!
//! ```text
//! cargo run --example write_read
//! ```

use std::time::Duration;
use uroce_verbs::{Access, Device, SendFlags, SendWr, WcStatus, WrOpcode};

const LEN: usize = 64 * 1024;

fn main() -> uroce_verbs::Result<()> {
    let server = Device::new("srv", "127.80.2.1".parse().unwrap()).open()?;
    let client = Device::new("cli", "127.80.2.2".parse().unwrap()).open()?;

    // The server exposes a region for remote write, read and atomics.
    let spd = server.alloc_pd()?;
    let scq = server.cq_builder().build()?;
    let sqp = spd.qp_builder(&scq).build()?;
    let exposed = spd.alloc_mr(
        LEN,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    )?;

    let cpd = client.alloc_pd()?;
    let ccq = client.cq_builder().build()?;
    let cqp = cpd.qp_builder(&ccq).build()?;
    let local = cpd.alloc_mr(LEN + 8, Access::LOCAL_WRITE)?;

    // Endpoints swapped in-process here; see the rc_pingpong example.
    sqp.connect(&cqp.endpoint())?;
    cqp.connect(&sqp.endpoint())?;

    let run = |wr: SendWr| -> uroce_verbs::Result<()> {
        cqp.post_send(&[wr]).map_err(|(_, e)| e)?;
        let wc = ccq.wait(1, Duration::from_secs(10));
        assert!(wc.len() == 1 && wc[0].status == WcStatus::Success, "{wc:?}");
        Ok(())
    };
    let rdma = |op: WrOpcode, off: usize, len: usize| {
        let mut wr = SendWr::new(op as u64, op);
        wr.flags = SendFlags::SIGNALED;
        wr.sg_list = [local.sge(off, len as u32)].into_iter().collect();
        wr.remote_addr = exposed.addr();
        wr.rkey = exposed.rkey();
        wr
    };

    // WRITE 64 KiB of a pattern into the server's region.
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
    local.write(0, &pattern).unwrap();
    run(rdma(WrOpcode::RdmaWrite, 0, LEN))?;
    assert_eq!(exposed.to_vec(0, LEN).unwrap(), pattern);
    println!("WRITE: {LEN} bytes landed in the server's region");

    // The server changes its region; READ brings the change back.
    exposed.write(100, b"changed by the server").unwrap();
    local.write(0, &vec![0u8; LEN]).unwrap();
    run(rdma(WrOpcode::RdmaRead, 0, LEN))?;
    assert_eq!(local.to_vec(100, 21).unwrap(), b"changed by the server");
    println!("READ: {LEN} bytes back, the server's change included");

    // Ten fetch-and-adds on the first word; each returns the old value.
    exposed.write(0, &0u64.to_ne_bytes()).unwrap();
    for i in 0..10u64 {
        let mut wr = rdma(WrOpcode::AtomicFetchAndAdd, LEN, 8);
        wr.compare_add = 5;
        run(wr)?;
        let old = u64::from_ne_bytes(local.to_vec(LEN, 8).unwrap().try_into().unwrap());
        assert_eq!(old, 5 * i);
    }
    let word = exposed
        .atomic_u64(0)
        .unwrap()
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(word, 50);
    println!("ATOMIC: 10 fetch-and-adds of 5, the server's word is {word}");
    Ok(())
}
