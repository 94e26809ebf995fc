//! The connection manager port: QP1 and its agent, reached through a
//! [`CmHandle`] (one method per thing the layers above ask of the CM,
//! each one step under the agent's lock), and the CM's value types: its
//! events, errors, reject reasons and SIDR statuses.

use super::{CmSink, Device, Result};
use crate::cm::gsi::GsiQp;
pub use crate::cm::{reason, CmError, CmEvent, Nanos, SIDR_OK, SIDR_REJECT};
use crate::cm::{CmAgent, CmConfig, ConnState};
use crate::engine::Kicker;
use parking_lot::Mutex;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use uroce_wire::cm::{RepRepr, ReqRepr};

impl Device {
    /// A connection manager agent for this device (node GUID `guid`),
    /// not yet on the wire: [`Device::attach_cm`] starts QP1 with it. The
    /// handle does not keep the device alive.
    pub fn cm_handle(&self, guid: u64) -> CmHandle {
        let engine = self.engine();
        let mut agent = CmAgent::new(
            CmConfig::from_env(self.shared.ip, guid),
            engine.counters().clone(),
        );
        if let Some(g) = engine.cm_group() {
            agent = agent.with_group(g);
        }
        CmHandle {
            agent: Arc::new(Mutex::new(agent)),
            kicker: engine.kicker(),
        }
    }

    /// Starts QP1 (the GSI QP) with `cm`'s agent; `sink` receives the
    /// agent's events ([`CmEvent`]) on the engine thread.
    pub fn attach_cm(&self, cm: &CmHandle, sink: CmSink) -> Result<()> {
        let engine = self.engine();
        let qp = GsiQp::new(
            cm.agent.clone(),
            self.shared.ip,
            engine.counters().clone(),
            Some(sink),
            engine.cm_group(),
        );
        Ok(engine.add_qp(qp)?)
    }
}

/// The connection manager agent of a device's QP1 (see
/// [`Device::cm_handle`]). Connections are named by the `u32` the agent
/// gave them (its local communication ID). Each call takes the agent's
/// lock once, at the engine's time, and then lets the engine send what
/// it queued.
pub struct CmHandle {
    agent: Arc<Mutex<CmAgent>>,
    kicker: Kicker,
}

impl std::fmt::Debug for CmHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmHandle")
    }
}

impl CmHandle {
    /// Runs `f` on the agent at the engine's time, then lets the engine
    /// send what it queued.
    fn with<T>(&self, f: impl FnOnce(&mut CmAgent, Nanos) -> T) -> T {
        let now = self.kicker.now();
        let r = f(&mut self.agent.lock(), now);
        self.kicker.kick(uroce_wire::mad::GSI_QPN);
        r
    }

    /// Takes the REQs (and SIDR_REQs) for `service_id`;
    /// [`CmError::InUse`] if it is already taken.
    pub fn listen(&self, service_id: u64) -> std::result::Result<(), CmError> {
        self.with(|a, _| a.listen(service_id))
    }

    /// Stops taking requests for `service_id` (connections made stay).
    pub fn unlisten(&self, service_id: u64) {
        self.with(|a, _| a.unlisten(service_id));
    }

    /// Sends a REQ to `dst`; `req` carries everything but the local
    /// communication ID, the CA GUID, the response timeouts and the
    /// retries, which the agent fills in. Returns the connection.
    pub fn connect(&self, dst: IpAddr, req: &ReqRepr) -> std::result::Result<u32, CmError> {
        self.with(|a, now| a.connect(now, dst, req))
    }

    /// Sends a SIDR_REQ for `service_id` to `dst` (traffic class
    /// `tclass`). Returns the connection its reply will name.
    pub fn sidr_request(
        &self,
        dst: IpAddr,
        service_id: u64,
        tclass: u8,
        private_data: &[u8],
    ) -> std::result::Result<u32, CmError> {
        self.with(|a, now| a.sidr_request(now, dst, service_id, tclass, private_data))
    }

    /// Answers a received SIDR_REQ with `status` ([`SIDR_OK`]: the UD QP
    /// `qpn` with `qkey`; [`SIDR_REJECT`]: refused).
    pub fn sidr_reply(
        &self,
        conn: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> std::result::Result<(), CmError> {
        self.with(|a, now| a.sidr_reply(now, conn, status, qpn, qkey, private_data))
    }

    /// Sends the REP to a received REQ (the agent fills in the IDs).
    pub fn accept(&self, conn: u32, rep: &RepRepr) -> std::result::Result<(), CmError> {
        self.with(|a, now| a.accept(now, conn, rep))
    }

    /// Sends a REJ with `reason` (one of [`reason`]) to a received REQ
    /// or a received REP.
    pub fn reject(
        &self,
        conn: u32,
        reason: u16,
        private_data: &[u8],
    ) -> std::result::Result<(), CmError> {
        self.with(|a, _| a.reject(conn, reason, private_data))
    }

    /// Sends the RTU to a received REP: the connection is established.
    pub fn establish(&self, conn: u32, private_data: &[u8]) -> std::result::Result<(), CmError> {
        self.with(|a, _| a.establish(conn, private_data))
    }

    /// Passive side, REP sent: the QP saw the peer's traffic before the
    /// RTU, so the connection is established.
    pub fn notify_established(&self, conn: u32) -> std::result::Result<(), CmError> {
        self.with(|a, _| a.notify_established(conn))
    }

    /// Sends a DREQ if the connection is up: established, or accepted
    /// and waiting for its RTU (then, as the kernel, established is
    /// implied first). In any other state (the peer's DREQ came first and
    /// was answered, or the connection never came up) it does nothing.
    /// One step: nothing the engine does comes between the look at the
    /// state and the DREQ.
    pub fn disconnect(&self, conn: u32) -> std::result::Result<(), CmError> {
        self.with(|a, now| match a.state(conn) {
            Some(ConnState::Established) => a.disconnect(now, conn, &[]),
            Some(ConnState::RepSent) => {
                a.notify_established(conn)?;
                a.disconnect(now, conn, &[])
            }
            _ => Ok(()),
        })
    }

    /// Tears the connection down as its state says (a pending request
    /// rejected, an established connection disconnected) and forgets
    /// its user. Returns how long to wait for the peer's answer if a DREQ
    /// of ours is still unanswered (the time-wait period; see
    /// [`CmHandle::dreq_pending`]), else `None`. One step.
    pub fn destroy(&self, conn: u32) -> Option<Duration> {
        self.with(|a, now| {
            a.destroy(now, conn);
            (a.state(conn) == Some(ConnState::DreqSent))
                .then(|| Duration::from_nanos(a.timewait_ns()))
        })
    }

    /// Whether a DREQ of ours for `conn` waits for its answer (the peer's
    /// DREP, or its own DREQ).
    pub fn dreq_pending(&self, conn: u32) -> bool {
        self.agent.lock().state(conn) == Some(ConnState::DreqSent)
    }

    /// Sends `conn`'s last MAD (its DREQ, say) again now, without spending
    /// one of its retries: for a program about to exit, whose CM will not
    /// be there for the retries at the peer's response timeout.
    pub fn resend_last(&self, conn: u32) {
        self.with(|a, _| a.resend_last(conn));
    }
}
