//! The connection manager port: QP1 and its agent ([`CmLink`]), and
//! the CM's value types: its events, errors, connection states and
//! reject reasons.

use super::{CmSink, Device, Result};
use crate::cm::gsi::GsiQp;
use crate::cm::CmConfig;
pub use crate::cm::{reason, CmAgent, CmError, CmEvent, ConnState, Nanos, SIDR_OK, SIDR_REJECT};
use crate::engine::Kicker;
use parking_lot::Mutex;
use std::sync::Arc;

impl Device {
    /// A connection manager agent for this device (node GUID `guid`),
    /// not yet on the wire: [`Device::attach_cm`] starts QP1 with it. The
    /// link does not keep the device alive.
    pub fn cm_agent(&self, guid: u64) -> CmLink {
        let engine = self.engine();
        CmLink {
            agent: Arc::new(Mutex::new(CmAgent::new(
                CmConfig::from_env(self.shared.ip, guid),
                engine.counters().clone(),
            ))),
            kicker: engine.kicker(),
        }
    }

    /// Starts QP1 (the GSI QP) with `link`'s agent; `sink` receives the
    /// agent's events on the engine thread.
    pub fn attach_cm(&self, link: &CmLink, sink: CmSink) -> Result<()> {
        let engine = self.engine();
        let qp = GsiQp::new(
            link.agent.clone(),
            self.shared.ip,
            engine.counters().clone(),
            Some(sink),
        );
        Ok(engine.add_qp(qp)?)
    }
}

/// The connection manager agent of a device's QP1 (see
/// [`Device::cm_agent`]).
pub struct CmLink {
    agent: Arc<Mutex<CmAgent>>,
    kicker: Kicker,
}

impl std::fmt::Debug for CmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmLink")
    }
}

impl CmLink {
    /// Runs `f` on the agent at the engine's time, then lets the engine
    /// send what it queued.
    pub fn with_agent<T>(&self, f: impl FnOnce(&mut CmAgent, Nanos) -> T) -> T {
        let now = self.kicker.now();
        let r = f(&mut self.agent.lock(), now);
        self.kicker.kick(uroce_wire::mad::GSI_QPN);
        r
    }
    /// Reads the agent (nothing to send afterwards).
    pub fn peek<T>(&self, f: impl FnOnce(&CmAgent) -> T) -> T {
        f(&self.agent.lock())
    }
}
