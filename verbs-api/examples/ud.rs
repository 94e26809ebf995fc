//! Unreliable datagrams on uroce's Rust API: one UD QP sends to another
//! through an address handle, the receiver learns the sender from the
//! completion and the 40-byte GRH area, and answers through an address
//! handle made from them (`ibv_create_ah_from_wc`).
//!
//! ```text
//! cargo run --example ud
//! ```

use std::time::Duration;
use uroce_verbs::{
    Access, AddressVector, Device, QpType, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode,
};

const QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;

fn main() -> uroce_verbs::Result<()> {
    let a = Device::new("a", "127.80.3.1".parse().unwrap()).open()?;
    let b = Device::new("b", "127.80.3.2".parse().unwrap()).open()?;
    let (apd, bpd) = (a.alloc_pd()?, b.alloc_pd()?);
    let (acq, bcq) = (a.cq_builder().build()?, b.cq_builder().build()?);
    let aqp = apd.qp_builder(&acq).qp_type(QpType::Ud).build()?;
    let bqp = bpd.qp_builder(&bcq).qp_type(QpType::Ud).build()?;
    aqp.activate()?;
    bqp.activate()?;
    let amr = apd.alloc_mr(4096, Access::LOCAL_WRITE)?;
    let bmr = bpd.alloc_mr(4096, Access::LOCAL_WRITE)?;

    // UD receives have room for the GRH before the payload.
    let recv = |mr: &uroce_verbs::MemoryRegion| RecvWr {
        wr_id: 7,
        sg_list: [mr.sge(0, 1024 + GRH as u32)].into_iter().collect(),
    };
    bqp.post_recv(&[recv(&bmr)]).map_err(|(_, e)| e)?;
    aqp.post_recv(&[recv(&amr)]).map_err(|(_, e)| e)?;

    // a -> b: the address handle names b's address; the WR names its QP.
    let to_b = apd.create_ah(&AddressVector {
        dgid: bqp.endpoint().gid,
        ..AddressVector::default()
    })?;
    amr.write(2048, b"hello over UD").unwrap();
    let mut wr = SendWr::new(1, WrOpcode::Send);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list = [amr.sge(2048, 13)].into_iter().collect();
    wr.ud = Some(to_b.ud_dest(bqp.qp_num(), QKEY));
    aqp.post_send(&[wr]).map_err(|(_, e)| e)?;

    let wc = bcq.wait(1, Duration::from_secs(10));
    assert!(wc.len() == 1 && wc[0].status == WcStatus::Success, "{wc:?}");
    let got = bmr.to_vec(GRH, 13).unwrap();
    println!(
        "b got {:?} ({} bytes with the GRH) from QPN {:#x}",
        String::from_utf8_lossy(&got),
        wc[0].byte_len,
        wc[0].src_qp
    );
    assert_eq!(got, b"hello over UD");

    // b answers whoever sent it: an address handle from the completion.
    let back = bpd.create_ah_from_wc(&wc[0], &bmr.to_vec(0, GRH).unwrap())?;
    bmr.write(2048, b"and back").unwrap();
    let mut wr = SendWr::new(2, WrOpcode::Send);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list = [bmr.sge(2048, 8)].into_iter().collect();
    wr.ud = Some(back.ud_dest(wc[0].src_qp, QKEY));
    bqp.post_send(&[wr]).map_err(|(_, e)| e)?;
    // a's completions: its own send, then b's answer.
    let wc = acq.wait(2, Duration::from_secs(10));
    assert!(
        wc.len() == 2 && wc.iter().all(|w| w.status == WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(amr.to_vec(GRH, 8).unwrap(), b"and back");
    println!("a got \"and back\" through the address handle made from b's completion");
    Ok(())
}
