//! The device's connection manager port: QP1 and its CM agent, started
//! when a device opens, and the layer above that takes the agent's
//! events.
//!
//! The agent is the device's (as the kernel's CM is the HCA's): every
//! opened device answers CM MADs on QP1 whether or not the program uses
//! rdma_cm. rdma_cm's model (`uroce_rdmacm`, above this crate as
//! librdmacm is above libibverbs) installs itself on the port as its
//! [`CmLayer`] the first time it uses a device; until then, and for an
//! event the layer finds no id for, a request is refused
//! ([`CmPort::refuse`]) and the rest is forgotten.

use crate::error::Result;
use std::any::Any;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use uroce_provider::device::cm::CmEvent;
use uroce_provider::device::{self as face, CmHandle, CmSink};

/// The layer above a [`CmPort`] (rdma_cm's ids): where the agent's events
/// go.
pub trait CmLayer: Send + Sync + 'static {
    /// Takes the agent's `events`, on the device's engine thread: it must
    /// not wait for the engine (hand the work to the user's thread).
    fn route(&self, port: &CmPort, events: Vec<CmEvent>);
}

/// The installed layer, as itself (to hand back) and as a [`CmLayer`].
struct Layer {
    any: Arc<dyn Any + Send + Sync>,
    events: Arc<dyn CmLayer>,
}

/// A device's QP1 agent and the layer above it. One per open device,
/// shared by every [`Context`](crate::Context) on it
/// ([`Context::cm_port`](crate::Context::cm_port)). The layer reaches the
/// agent through [`CmPort::agent`].
pub struct CmPort {
    /// The agent (does not keep the device alive).
    agent: CmHandle,
    ip: IpAddr,
    layer: OnceLock<Layer>,
}

impl std::fmt::Debug for CmPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CmPort({})", self.ip)
    }
}

impl CmPort {
    /// Starts QP1 on the device with an agent for the device at `ip`.
    pub(crate) fn start(dev: &face::Device, ip: IpAddr, guid: u64) -> Result<Arc<CmPort>> {
        let port = Arc::new(CmPort {
            agent: dev.cm_handle(guid),
            ip,
            layer: OnceLock::new(),
        });
        let weak = Arc::downgrade(&port);
        let sink: CmSink = Arc::new(move |events| {
            if let Some(p) = weak.upgrade() {
                p.route(events);
            }
        });
        dev.attach_cm(&port.agent, sink)?;
        Ok(port)
    }

    /// On the engine thread: the events to the layer, or refused.
    fn route(&self, events: Vec<CmEvent>) {
        match self.layer.get() {
            Some(l) => l.events.route(self, events),
            None => events.into_iter().for_each(|e| self.refuse(e)),
        }
    }

    /// What becomes of an event nobody wants (its id went away, or no
    /// layer is installed): a request (REQ, SIDR_REQ) is refused, the
    /// rest is forgotten.
    pub fn refuse(&self, e: CmEvent) {
        if let CmEvent::ReqReceived { conn, .. } | CmEvent::SidrReqReceived { conn, .. } = e {
            self.agent.destroy(conn);
        }
    }

    /// The layer of type `L` on this port, installed with `make` if the
    /// port has none yet; `None` if a layer of another type is installed.
    pub fn layer<L: CmLayer>(&self, make: impl FnOnce() -> L) -> Option<Arc<L>> {
        let l = self.layer.get_or_init(|| {
            let l = Arc::new(make());
            Layer {
                any: l.clone(),
                events: l,
            }
        });
        l.any.clone().downcast::<L>().ok()
    }

    /// The device's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The device's CM agent: listen, connect, accept, reject,
    /// disconnect, SIDR and the rest, one step each (the face's
    /// [`CmHandle`]).
    pub fn agent(&self) -> &CmHandle {
        &self.agent
    }
}
