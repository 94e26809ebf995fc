//! Completions for async runtimes (feature `tokio`): a CQ's work
//! completions as a [`Stream`](futures_core::Stream), woken by its
//! completion channel's descriptor through tokio's reactor instead of a
//! busy poll or a blocked thread.
//!
//! ```no_run
//! # async fn run(ctx: uroce_verbs::Context) -> uroce_verbs::Result<()> {
//! use uroce_verbs::CqStream;
//! let ch = ctx.create_comp_channel()?;
//! let cq = ctx.cq_builder().channel(&ch).build()?;
//! let mut completions = CqStream::new(&cq, &ch)?;
//! // ... post work on a QP using `cq` ...
//! let wc = completions.next_wc().await?;
//! println!("{:?} completed: {:?}", wc.wr_id, wc.status);
//! # Ok(())
//! # }
//! ```

use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::events::CompChannel;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use uroce_provider::types::Wc;

/// The channel's descriptor, borrowed for tokio's reactor (never closed
/// here: the channel owns it).
struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A CQ's completions as an async stream. The CQ must have been created
/// with `channel` ([`crate::CqBuilder::channel`]), a channel that serves
/// this CQ alone. The stream arms the CQ
/// ([`CompletionQueue::req_notify`]) whenever it runs dry, waits for the
/// channel's descriptor to become readable, and acknowledges every event
/// it takes, so the CQ can be destroyed once the stream is dropped.
/// Needs a tokio runtime with I/O enabled.
pub struct CqStream<'a> {
    cq: &'a CompletionQueue,
    channel: &'a CompChannel,
    fd: AsyncFd<ChannelFd>,
    armed: bool,
}

impl std::fmt::Debug for CqStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CqStream(cq {})", self.cq.handle())
    }
}

impl<'a> CqStream<'a> {
    /// Registers `channel`'s descriptor with the current tokio runtime
    /// (an error outside one).
    pub fn new(cq: &'a CompletionQueue, channel: &'a CompChannel) -> Result<CqStream<'a>> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Invalid(
                "CqStream::new outside a tokio runtime".into(),
            ));
        }
        if !cq.inner.reports_to(&channel.inner) {
            // Its events would go elsewhere, or nowhere: the stream would
            // wait for ever.
            return Err(Error::Invalid(
                "the CQ was not created with this completion channel".into(),
            ));
        }
        // SAFETY: the descriptor is the channel's eventfd, which the
        // channel owns and closes only when it is dropped; the stream
        // borrows the channel for its whole life, so the descriptor stays
        // open and the same while the AsyncFd (dropped with the stream)
        // is registered.
        let fd =
            unsafe { AsyncFd::register_with_interest(ChannelFd(channel.fd()), Interest::READABLE) }
                .map_err(|e| Error::Engine(format!("tokio reactor: {e}")))?;
        Ok(CqStream {
            cq,
            channel,
            fd,
            armed: false,
        })
    }

    /// The next work completion (whatever its status).
    pub async fn next_wc(&mut self) -> Result<Wc> {
        std::future::poll_fn(|cx| self.poll_wc(cx)).await
    }

    fn poll_wc(&mut self, cx: &mut Context<'_>) -> Poll<Result<Wc>> {
        loop {
            if let Some(wc) = self.cq.poll_one() {
                return Poll::Ready(Ok(wc));
            }
            if !self.armed {
                // Arm, then poll again: a completion that arrived before
                // arming raises no event (as with verbs).
                self.cq.req_notify(false)?;
                self.armed = true;
                continue;
            }
            let mut ready = match self.fd.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(Error::Engine(format!("tokio reactor: {e}"))))
                }
            };
            match self.channel.try_get_cq_event() {
                Ok(ev) if ev.is_for(self.cq) => {
                    self.cq.ack_events(1);
                    self.armed = false;
                }
                Ok(_) => {
                    return Poll::Ready(Err(Error::Invalid(
                        "the completion channel serves another CQ too: give the stream a channel of its own".into(),
                    )))
                }
                Err(Error::WouldBlock) => ready.clear_ready(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl futures_core::Stream for CqStream<'_> {
    type Item = Result<Wc>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Wc>>> {
        self.get_mut().poll_wc(cx).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, QpType, SendFlags, SendWr, WcStatus, WrOpcode};

    /// A UD QP that sends `n` empty messages to itself, signaled, wr_id i.
    fn send_to_self(ctx: &crate::Context, cq: &CompletionQueue, n: u64) -> crate::QueuePair {
        let pd = ctx.alloc_pd().unwrap();
        let qp = pd.qp_builder(cq).qp_type(QpType::Ud).build().unwrap();
        qp.activate().unwrap();
        let ah = pd
            .create_ah(&crate::AddressVector {
                dgid: qp.endpoint().gid,
                ..Default::default()
            })
            .unwrap();
        for i in 0..n {
            let mut wr = SendWr::new(i, WrOpcode::Send);
            wr.flags = SendFlags::SIGNALED;
            wr.ud = Some(ah.ud_dest(qp.qp_num(), 0x1111_1111));
            qp.post_send(&[wr]).unwrap();
        }
        qp
    }

    #[test]
    fn refused_outside_a_runtime_and_with_another_channel() {
        let ctx = Device::new("as1", "127.70.10.1".parse().unwrap())
            .open()
            .unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let other = ctx.create_comp_channel().unwrap();
        let cq = ctx.cq_builder().channel(&ch).build().unwrap();
        let bare = ctx.cq_builder().build().unwrap();
        assert!(matches!(CqStream::new(&cq, &ch), Err(Error::Invalid(_))));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(CqStream::new(&cq, &ch).is_ok());
            assert!(matches!(CqStream::new(&cq, &other), Err(Error::Invalid(_))));
            assert!(matches!(CqStream::new(&bare, &ch), Err(Error::Invalid(_))));
        });
    }

    #[tokio::test(flavor = "current_thread")]
    async fn completions_arrive_in_order_across_waits() {
        use futures_core::Stream;
        let ctx = Device::new("as2", "127.70.10.2".parse().unwrap())
            .open()
            .unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.cq_builder().channel(&ch).build().unwrap();
        let mut s = CqStream::new(&cq, &ch).unwrap();
        // Posted before the first wait, and after it.
        let _q1 = send_to_self(&ctx, &cq, 3);
        for i in 0..3 {
            let wc = s.next_wc().await.unwrap();
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        }
        let _q2 = send_to_self(&ctx, &cq, 2);
        let mut wrs = Vec::new();
        while wrs.len() < 2 {
            let wc = std::future::poll_fn(|cx| std::pin::Pin::new(&mut s).poll_next(cx))
                .await
                .unwrap()
                .unwrap();
            wrs.push(wc.wr_id);
        }
        assert_eq!(wrs, [0, 1]);
        drop(s);
        // Every event the stream took was acknowledged: the CQ can go.
        drop((_q1, _q2));
        assert!(cq.destroy().is_ok());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_event_for_another_cq_on_the_channel_is_an_error() {
        let ctx = Device::new("as3", "127.70.10.3".parse().unwrap())
            .open()
            .unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let mine = ctx.cq_builder().channel(&ch).build().unwrap();
        let theirs = ctx.cq_builder().channel(&ch).build().unwrap();
        theirs.req_notify(false).unwrap();
        let _q = send_to_self(&ctx, &theirs, 1);
        let mut s = CqStream::new(&mine, &ch).unwrap();
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), s.next_wc())
            .await
            .expect("the stream answers, not waits");
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    }
}
