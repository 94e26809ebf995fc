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
