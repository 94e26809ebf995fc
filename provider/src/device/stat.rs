//! What `uroce stat` shows of a device (the serialisation the state
//! server answers with, [`crate::diag::stat`]).

use super::{active_mtu, interface_mtu, IoPath, SnapshotHandle};
use crate::cq::CqInner;
use crate::diag::stat::{CqState, DeviceState, MrState, PdState, QpStat, SrqState};
use crate::engine::Engine;
use crate::engine::QpSnapshot;
use crate::memory::{KeyTable, MrInner, PdId};
use crate::qp_attr::QpCap;
use crate::transport::{RecvQueue, SendQueue, StateCell};
use crate::types::{Mtu, QpType};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Weak};

/// What `uroce stat` shows of a device, apart from the device: the state
/// server holds this, never the device (a device it held would stay
/// bound to its address after the program closed it).
pub(super) struct Registry {
    pub(super) keys: Arc<KeyTable>,
    pub(super) ip: IpAddr,
    pub(super) active_mtu: Mtu,
    pub(super) counters: Arc<crate::counters::Counters>,
    pub(super) io: IoPath,
    pub(super) snapshots: SnapshotHandle,
    /// The name the verbs layer gave the device (`uroce0`).
    pub(super) name: std::sync::OnceLock<String>,
    /// What `uroce stat` lists of the device's objects.
    pub(super) objects: Mutex<Objects>,
}

/// The device's objects as `uroce stat` lists them (regions are in the
/// key table): entries the objects remove when they go (QPs, PDs) or
/// that lapse with them (CQs, SRQs).
#[derive(Default)]
pub(super) struct Objects {
    pub(super) pds: BTreeSet<PdId>,
    pub(super) cqs: Vec<Weak<CqInner>>,
    pub(super) srqs: Vec<SrqEntry>,
    pub(super) qps: BTreeMap<u32, QpEntry>,
}

pub(super) struct SrqEntry {
    pub(super) rq: Weak<RecvQueue>,
    pub(super) pd: PdId,
    pub(super) max_sge: u32,
}

pub(super) struct QpEntry {
    pub(super) qp_type: QpType,
    pub(super) pd: PdId,
    pub(super) cap: QpCap,
    pub(super) sq: Arc<SendQueue>,
    pub(super) rq: Arc<RecvQueue>,
    pub(super) send_cq: u32,
    pub(super) recv_cq: u32,
    pub(super) srq: Option<u32>,
    /// Its published state, with its explained errors.
    pub(super) state: Arc<StateCell>,
}

/// Every device this process has open, for `uroce stat`.
static OPEN: Mutex<Vec<Weak<Registry>>> = Mutex::new(Vec::new());

/// The state of every device this process has open (see
/// [`crate::diag::stat`]).
///
/// The server's thread holds no device, only its [`Registry`]: a program
/// that closes a device and opens its address again at once must not
/// find the address still bound because `uroce stat` asked.
pub(crate) fn live_states() -> Vec<DeviceState> {
    let asked: Vec<_> = {
        let mut open = OPEN.lock();
        open.retain(|w| w.strong_count() > 0);
        open.clone()
    }
    .into_iter()
    .filter_map(|w| {
        let answer = w.upgrade()?.snapshots.request().ok();
        Some((w, answer))
    })
    .collect();
    let deadline = std::time::Instant::now() + crate::diag::stat::ENGINE_WAIT;
    asked
        .into_iter()
        .filter_map(|(w, answer)| {
            let qps = answer
                .and_then(|rx| rx.recv_deadline(deadline).ok())
                .unwrap_or_default();
            Some(w.upgrade()?.state(qps))
        })
        .collect()
}

impl Registry {
    /// The registry of a device starting on `engine`.
    pub(super) fn new(engine: &Engine, keys: Arc<KeyTable>, ip: IpAddr) -> Arc<Registry> {
        Arc::new(Registry {
            keys,
            ip,
            active_mtu: active_mtu(ip),
            counters: engine.counters().clone(),
            io: engine.io_path(),
            snapshots: engine.snapshot_handle(),
            name: std::sync::OnceLock::new(),
            objects: Mutex::default(),
        })
    }
    /// Lists the device among the open ones and starts the state server
    /// (once a process).
    pub(super) fn publish(self: &Arc<Registry>) {
        let mut open = OPEN.lock();
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(self));
        drop(open);
        crate::diag::stat::serve_lazily(live_states);
    }
    pub(super) fn add_pd(&self, id: PdId) {
        self.objects.lock().pds.insert(id);
    }
    pub(super) fn remove_pd(&self, id: PdId) {
        self.objects.lock().pds.remove(&id);
    }
    pub(super) fn add_cq(&self, cq: &Arc<CqInner>) {
        let mut objects = self.objects.lock();
        objects.cqs.retain(|c| c.strong_count() > 0);
        objects.cqs.push(Arc::downgrade(cq));
    }
    pub(super) fn add_srq(&self, e: SrqEntry) {
        let mut objects = self.objects.lock();
        objects.srqs.retain(|e| e.rq.strong_count() > 0);
        objects.srqs.push(e);
    }
    pub(super) fn add_qp(&self, qpn: u32, e: QpEntry) {
        self.objects.lock().qps.insert(qpn, e);
    }
    pub(super) fn remove_qp(&self, qpn: u32) {
        self.objects.lock().qps.remove(&qpn);
    }
    pub(super) fn name(&self) -> String {
        self.name
            .get()
            .cloned()
            .unwrap_or_else(|| self.ip.to_string())
    }

    /// The device as `uroce stat` shows it: its objects from the
    /// registry and the key table, its QPs' attributes and tallies from
    /// the engine (without them if it does not answer in time).
    pub(super) fn state(&self, qps: Vec<QpSnapshot>) -> DeviceState {
        let live: HashMap<u32, QpSnapshot> = qps.into_iter().map(|q| (q.qpn, q)).collect();
        let mut mrs: Vec<MrState> = self.keys.regions().iter().map(|m| mr_state(m)).collect();
        mrs.sort_by_key(|m| (m.pdn, m.lkey));
        let objects = self.objects.lock();
        let cqs = objects
            .cqs
            .iter()
            .filter_map(Weak::upgrade)
            .map(|c| CqState {
                cqn: c.handle(),
                cqe: c.depth(),
                pending: c.len(),
                unacked_events: c.unacked_events(),
            })
            .collect();
        let srqs: Vec<SrqState> = objects
            .srqs
            .iter()
            .filter_map(|e| {
                let rq = e.rq.upgrade()?;
                Some(SrqState {
                    srqn: rq.srq_handle(),
                    pdn: e.pd,
                    max_wr: rq.capacity() as u32,
                    max_sge: e.max_sge,
                    posted: rq.len(),
                    limit: rq.limit(),
                })
            })
            .collect();
        let qps: Vec<QpStat> = objects
            .qps
            .iter()
            .map(|(&qpn, e)| qp_stat(qpn, e, live.get(&qpn)))
            .collect();
        // Every PD handle, and every PD an object names (made with
        // `alloc_pd`).
        let pdns: BTreeSet<PdId> = objects
            .pds
            .iter()
            .copied()
            .chain(mrs.iter().map(|m| m.pdn))
            .chain(qps.iter().map(|q| q.pdn))
            .chain(srqs.iter().map(|s| s.pdn))
            .collect();
        let pds = pdns
            .into_iter()
            .map(|pdn| PdState {
                pdn,
                mrs: mrs.iter().filter(|m| m.pdn == pdn).count(),
                qps: qps.iter().filter(|q| q.pdn == pdn).count(),
                srqs: srqs.iter().filter(|s| s.pdn == pdn).count(),
            })
            .collect();
        DeviceState {
            name: self.name(),
            addr: self.ip.to_string(),
            port: 1,
            port_state: "ACTIVE".into(),
            active_mtu: self.active_mtu.bytes(),
            netdev_mtu: interface_mtu(self.ip),
            io_path: self.io.to_string(),
            pds,
            mrs,
            cqs,
            srqs,
            qps,
            counters: self
                .counters
                .snapshot()
                .entries()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        }
    }
}

pub(super) fn mr_state(m: &MrInner) -> MrState {
    MrState {
        pdn: m.pd(),
        lkey: m.lkey(),
        rkey: m.rkey(),
        iova: m.iova(),
        length: m.len() as u64,
        access: m
            .access()
            .iter_names()
            .map(|(name, _)| name.to_owned())
            .collect(),
    }
}

/// A QP's line: what the face knows (type, PD, queues) and what the
/// engine said (`live`: state, PSNs, peer, tally).
pub(super) fn qp_stat(qpn: u32, e: &QpEntry, live: Option<&QpSnapshot>) -> QpStat {
    let attr = live.map(|l| l.attr).unwrap_or_default();
    let tally = live.map(|l| l.tally).unwrap_or_default();
    // RTR gave it a peer (RC, UC; a QP that went to ERR before has none).
    let connected = e.qp_type != QpType::Ud && attr.dest_qp_num != 0;
    let last = tally.last_error;
    QpStat {
        qpn,
        qp_type: format!("{:?}", e.qp_type).to_uppercase(),
        state: match live {
            Some(_) => attr.qp_state.name().into(),
            None => "UNKNOWN".into(),
        },
        pdn: e.pd,
        dest_qpn: attr.dest_qp_num,
        dest_addr: connected.then(|| attr.ah_attr.ip().to_string()),
        path_mtu: attr.path_mtu.bytes(),
        sq_psn: attr.sq_psn,
        rq_psn: attr.rq_psn,
        send_cq: e.send_cq,
        recv_cq: e.recv_cq,
        srq: e.srq,
        sq_wrs: e.sq.outstanding(),
        max_send_wr: e.cap.max_send_wr,
        rq_wrs: if e.srq.is_some() { 0 } else { e.rq.len() },
        max_recv_wr: e.cap.max_recv_wr,
        inflight_psns: live.map_or(0, |l| l.inflight_psns),
        retransmits: tally.retransmits,
        retry_timeouts: tally.retry_timeouts,
        rnr_naks_rcvd: tally.rnr_naks_rcvd,
        seq_naks_rcvd: tally.seq_naks_rcvd,
        last_error_status: last.map(|l| l.status as u32),
        last_error_wr_id: last.map(|l| l.wr_id),
        // The QP's own explanation (which check failed, on which side;
        // `UROCE_EXPLAIN`), else the completion's status and WR. A flush
        // is explained by the error that moved the QP to ERR.
        last_error: e
            .state
            .error_cause()
            .or_else(|| e.state.last_error())
            .map(|x| x.to_string())
            .or_else(|| {
                last.map(|l| {
                    let side = if l.send { "send" } else { "receive" };
                    format!(
                        "{} ({}) on {side} wr_id {:#x}",
                        l.status, l.status as u32, l.wr_id
                    )
                })
            }),
    }
}
