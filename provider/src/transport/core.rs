//! What every QP type shares (RC, UC, UD): its configuration, state and
//! attributes, admission of packets, COMM_EST, the query view, modify's
//! checks and state publishing. The transports hold one [`QpCore`] and add
//! their requester and responder.

use super::{PeerPin, QpConfig};
use crate::events::EventType;
use crate::qp_attr::{check_modify, AttrMask, ModifyError, QpAttr};
use crate::types::{QpState, QpType};

/// The state every QP type shares.
#[derive(Debug)]
pub struct QpCore {
    /// What the QP was built from.
    pub cfg: QpConfig,
    /// Current state (also published in `cfg.state`).
    pub state: QpState,
    /// Attributes as last modified.
    pub attr: QpAttr,
    /// COMM_EST was reported (first packet received in RTR).
    pub comm_est: bool,
    /// The peer as admission checks it (connected types).
    pub pin: PeerPin,
}

impl QpCore {
    /// A QP in RESET.
    pub fn new(cfg: QpConfig) -> QpCore {
        QpCore {
            cfg,
            state: QpState::Reset,
            attr: QpAttr::default(),
            comm_est: false,
            pin: PeerPin::default(),
        }
    }

    /// Sets the state and publishes it ([`super::StateCell`]).
    pub fn set_state(&mut self, s: QpState) {
        self.state = s;
        self.cfg.state.set(s);
    }

    /// True in the states that take packets (RTR, RTS, SQD, SQE).
    pub fn receiving(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// The attributes as `ibv_query_qp` reports them, with the transport's
    /// own send and receive PSNs.
    pub fn query(&self, sq_psn: u32, rq_psn: u32) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a.cur_qp_state = self.state;
        a.cap = self.cfg.cap;
        a.sq_psn = sq_psn;
        a.rq_psn = rq_psn;
        a
    }

    /// The first half of every modify: the spec's table for `qp_type`
    /// (IBA ch. 10-11, table 91), then the attributes taken. Returns the
    /// state to move to; the transport applies its own attributes and
    /// calls [`QpCore::finish_modify`].
    pub fn begin_modify(
        &mut self,
        qp_type: QpType,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<QpState, ModifyError> {
        let to = check_modify(qp_type, self.state, attr, mask, &self.cfg.limits)?;
        self.attr.take_masked(attr, mask, self.cfg.local_ip)?;
        Ok(to)
    }

    /// The last half of every modify: the new state, and SQD's draining
    /// flag (set on entry, cleared on leaving).
    pub fn finish_modify(&mut self, from: QpState, to: QpState) {
        self.set_state(to);
        if to == QpState::Sqd && from != QpState::Sqd {
            self.attr.sq_draining = true;
        }
        if to != QpState::Sqd {
            self.attr.sq_draining = false;
        }
    }

    /// A packet was accepted: the first one in RTR reports COMM_EST.
    pub fn note_received(&mut self) {
        if self.state == QpState::Rtr && !self.comm_est {
            self.comm_est = true;
            self.cfg.event(EventType::CommEst);
        }
    }

    /// Back to RESET: attributes, COMM_EST and the peer pin forgotten.
    pub fn reset(&mut self) {
        self.comm_est = false;
        self.pin = PeerPin::default();
        self.attr = QpAttr::default();
    }
}
