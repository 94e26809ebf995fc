//! The events rdma_cm reports (`struct rdma_cm_event`) and the
//! parameters they carry.

use super::CmId;
use uroce_verbs::AddressVector;

/// The Q_Key of rdma_cm's UD ids (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `enum rdma_cm_event_type`, same numbering.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventType {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
}

impl CmEventType {
    /// The words `rdma_event_str` gives.
    pub fn as_str(self) -> &'static str {
        use CmEventType::*;
        match self {
            AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Rejected => "RDMA_CM_EVENT_REJECTED",
            Established => "RDMA_CM_EVENT_ESTABLISHED",
            Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

/// `struct rdma_conn_param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (at most 56 bytes in a TCP-port-space connect, 196 in
    /// an accept, 148 in a reject).
    pub private_data: Vec<u8>,
    /// RDMA READs/atomics the peer may have outstanding at us.
    pub responder_resources: u8,
    /// RDMA READs/atomics we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// End-to-end flow control (carried, not used).
    pub flow_control: bool,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits; 7: forever).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ (for an id without a QP).
    pub srq: bool,
    /// The QP number (for an id without a QP).
    pub qp_num: u32,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// `struct rdma_ud_param`: where a UD peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// Private data.
    pub private_data: Vec<u8>,
    /// The address vector to reach the peer.
    pub ah_attr: AddressVector,
    /// The peer's QP.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// `struct rdma_cm_event`.
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// What happened.
    pub event: CmEventType,
    /// The id it happened to (for a connect request: the new id).
    pub id: CmId,
    /// For a connect request: the listening id.
    pub listen_id: Option<CmId>,
    /// 0, a REJ reason (rejected), a SIDR status, or a negative errno.
    pub status: i32,
    /// Connection parameters (connected ids).
    pub conn: ConnParam,
    /// UD parameters (UD ids).
    pub ud: Option<UdParam>,
}
