//! The device side: rdma_cm's layer on each device's CM port, which
//! routes the agent's events to the ids they belong to (on the engine
//! thread: an event waits in its id's channel until the user takes it).

use super::channel::Pending;
use super::id::IdInner;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;
use uroce_provider::device::cm as pcm;
use uroce_provider::device::CmHandle;
use uroce_verbs::{CmLayer, CmPort, Context, Error, Result};
use uroce_wire::cma::{self, CmaHeaderRepr};

/// rdma_cm's layer on a device's [`CmPort`]: which id each connection
/// and listened service belongs to.
#[derive(Default)]
struct Ids {
    routes: Mutex<Routes>,
}

/// A device's CM as rdma_cm uses it: the device's port (its agent) and
/// rdma_cm's layer on it.
#[derive(Clone)]
pub(super) struct CmDevice {
    port: Arc<CmPort>,
    ids: Arc<Ids>,
}

impl std::fmt::Debug for CmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CmDevice({})", self.port.ip())
    }
}

#[derive(Default)]
pub(super) struct Routes {
    pub(super) conns: HashMap<u32, Weak<IdInner>>,
    /// Per service: the ids listening (two when an IPv4 and an IPv6 id
    /// restricted to their families share a port).
    pub(super) listeners: HashMap<u64, Vec<Listener>>,
}

/// An id listening on a service.
pub(super) struct Listener {
    pub(super) id: Weak<IdInner>,
    /// The IP version of the CMA headers it takes (`Some(true)`: IPv4
    /// only; `None`: both), as the kernel's `cma_match_private_data`.
    pub(super) v4: Option<bool>,
}

impl Routes {
    /// The listener on `sid` for a request whose CMA header (at the start
    /// of `private_data`) is of its IP version; without a CMA header (the
    /// IB port space), the first.
    fn listener(&self, sid: u64, private_data: &[u8]) -> Option<Arc<IdInner>> {
        let v4 = cma::CmaHeader::new_checked(private_data)
            .ok()
            .and_then(|h| CmaHeaderRepr::parse(&h).ok())
            .map(|h| h.src.is_ipv4());
        self.listeners
            .get(&sid)?
            .iter()
            .filter(|l| l.v4.is_none() || v4.is_none() || l.v4 == v4)
            .find_map(|l| l.id.upgrade())
    }

    /// Removes `id`'s listen on `sid` (and listeners gone); true when
    /// nobody listens there any more.
    fn unlisten(&mut self, sid: u64, id: *const IdInner) -> bool {
        let Some(list) = self.listeners.get_mut(&sid) else {
            return true;
        };
        list.retain(|l| l.id.strong_count() > 0 && !std::ptr::eq(l.id.as_ptr(), id));
        if list.is_empty() {
            self.listeners.remove(&sid);
            return true;
        }
        false
    }
}

impl CmDevice {
    /// The CM of `ctx`'s device, rdma_cm's layer installed on its port
    /// the first time.
    pub(super) fn of(ctx: &Context) -> Result<CmDevice> {
        let port = ctx.cm_port().clone();
        let ids = port
            .layer(Ids::default)
            .ok_or_else(|| Error::Invalid("another CM layer holds the device".into()))?;
        Ok(CmDevice { port, ids })
    }

    /// The device's address.
    pub(super) fn ip(&self) -> IpAddr {
        self.port.ip()
    }

    pub(super) fn routes(&self) -> MutexGuard<'_, Routes> {
        self.ids.routes.lock()
    }

    /// Stops `id`'s listen on `sid`: the agent stops taking its REQs once
    /// no other id listens there.
    pub(super) fn unlisten(&self, sid: u64, id: *const IdInner) {
        if self.routes().unlisten(sid, id) {
            self.agent().unlisten(sid);
        }
    }

    /// The device's CM agent.
    pub(super) fn agent(&self) -> &CmHandle {
        self.port.agent()
    }

    /// Waits (at most `limit`) while our DREQ for `conn` is unanswered.
    /// The kernel's CM answers the peer from time-wait after the program
    /// has gone; uroce's CM goes with the program. A program that
    /// disconnects, destroys its id and exits at once (perftest -R's
    /// server) would otherwise leave a peer whose own DREQ crossed a lost
    /// one of ours with nobody to answer it: ~100 s of DREQ retries
    /// before the kernel reports DISCONNECTED. The peer's DREP, or its
    /// DREQ (answered), ends the wait; the time-wait period bounds it.
    /// The DREQ goes again every quarter of the wait: the retries at the
    /// peer's response timeout (4.3 s from the kernel) would come after
    /// the program has gone, and a peer whose only DREQ from us was lost
    /// (and who sends none of its own: rping's server waits for
    /// DISCONNECTED) would wait forever.
    pub(super) fn linger(&self, conn: u32, limit: Duration) {
        let start = std::time::Instant::now();
        let mut resent = 0u32;
        while start.elapsed() < limit && self.agent().dreq_pending(conn) {
            if start.elapsed() >= limit / 4 * (resent + 1) {
                resent += 1;
                self.agent().resend_last(conn);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl CmLayer for Ids {
    /// On the engine thread: each event to its id's channel.
    fn route(&self, port: &CmPort, events: Vec<pcm::CmEvent>) {
        for e in events {
            let target = {
                let routes = self.routes.lock();
                match &e {
                    pcm::CmEvent::ReqReceived {
                        service_id, req, ..
                    } => routes.listener(*service_id, &req.private_data),
                    pcm::CmEvent::SidrReqReceived {
                        service_id, req, ..
                    } => routes.listener(*service_id, &req.private_data),
                    other => routes.conns.get(&event_conn(other)).and_then(Weak::upgrade),
                }
            };
            match target {
                Some(id) => {
                    {
                        // Under the id's channel lock: migrate() moves what
                        // is queued, so nothing may land in the old channel
                        // after it.
                        let ch = id.channel.lock();
                        ch.push(Pending::Agent(id.clone(), e));
                    }
                    release_off_engine_thread(id);
                }
                // Nobody wants it (the id went away): a request is
                // refused, the rest is forgotten.
                None => port.refuse(e),
            }
        }
    }
}

/// Lets go of a handle `route` upgraded on the engine thread. The user may
/// have taken the event and dropped the id meanwhile; then this is the
/// last handle, and dropping an id destroys its QP and may drop the
/// device, which waits for the engine thread: on the engine thread itself
/// that would never return. The last handle is released on a thread of
/// its own instead.
fn release_off_engine_thread(id: Arc<IdInner>) {
    if let Ok(last) = Arc::try_unwrap(id) {
        let _ = uroce_provider::device::spawn_thread("uroce-cm-release".into(), move || drop(last));
    }
}

fn event_conn(e: &pcm::CmEvent) -> u32 {
    use pcm::CmEvent::*;
    match e {
        ReqReceived { conn, .. }
        | RepReceived { conn, .. }
        | Established { conn }
        | Rejected { conn, .. }
        | Unreachable { conn }
        | Disconnected { conn, .. }
        | TimewaitExit { conn }
        | SidrReqReceived { conn, .. }
        | SidrRepReceived { conn, .. } => *conn,
    }
}
