//! Completions in an async program (feature `tokio`): a CQ's work
//! completions as a stream, woken through its completion channel's
//! descriptor by tokio's reactor, so one runtime thread serves the
//! RDMA work and a timer at once without busy-polling.
//!
//! ```text
//! cargo run --example tokio_completions --features tokio
//! ```

use std::time::Duration;
use uroce_verbs::{Access, CqStream, Device, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode};

const MESSAGES: u64 = 100;

#[tokio::main(flavor = "current_thread")]
async fn main() -> uroce_verbs::Result<()> {
    let a = Device::new("a", "127.80.4.1".parse().unwrap()).open()?;
    let b = Device::new("b", "127.80.4.2".parse().unwrap()).open()?;
    let (apd, bpd) = (a.alloc_pd()?, b.alloc_pd()?);
    let (ach, bch) = (a.create_comp_channel()?, b.create_comp_channel()?);
    let acq = a.cq_builder().channel(&ach).build()?;
    let bcq = b.cq_builder().channel(&bch).build()?;
    let aqp = apd.qp_builder(&acq).signal_all(true).build()?;
    let bqp = bpd.qp_builder(&bcq).build()?;
    aqp.connect(&bqp.endpoint())?;
    bqp.connect(&aqp.endpoint())?;
    let amr = apd.alloc_mr(64, Access::LOCAL_WRITE)?;
    let bmr = bpd.alloc_mr(64 * MESSAGES as usize, Access::LOCAL_WRITE)?;
    for i in 0..MESSAGES {
        let wr = RecvWr {
            wr_id: i,
            sg_list: [bmr.sge(64 * i as usize, 64)].into_iter().collect(),
        };
        bqp.post_recv(&[wr]).map_err(|(_, e)| e)?;
    }

    // The receiver: awaits each completion as it comes.
    let mut recvd = CqStream::new(&bcq, &bch)?;
    let mut sent = CqStream::new(&acq, &ach)?;
    let receiver = async {
        for i in 0..MESSAGES {
            let wc = recvd.next_wc().await?;
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        }
        uroce_verbs::Result::Ok(())
    };
    // The sender: one message every millisecond, each awaited.
    let sender = async {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        for i in 0..MESSAGES {
            tick.tick().await;
            amr.write(0, format!("message {i}").as_bytes()).unwrap();
            let mut wr = SendWr::new(i, WrOpcode::Send);
            wr.flags = SendFlags::SIGNALED;
            wr.sg_list = [amr.sge(0, 64)].into_iter().collect();
            aqp.post_send(&[wr]).map_err(|(_, e)| e)?;
            let wc = sent.next_wc().await?;
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        }
        uroce_verbs::Result::Ok(())
    };
    let (r, s) = tokio::join!(receiver, sender);
    r?;
    s?;
    let last = bmr.to_vec(64 * (MESSAGES as usize - 1), 10).unwrap();
    println!(
        "{MESSAGES} sends and receives awaited on one thread; the last: {:?}",
        String::from_utf8_lossy(&last)
    );
    Ok(())
}
