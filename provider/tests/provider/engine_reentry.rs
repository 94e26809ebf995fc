//! A QP's callbacks run on the engine thread. A handle to the engine used
//! there (a CM id or QP whose last handle is let go inside a callback)
//! must neither wait for the engine thread, which is itself, nor join it:
//! blocking calls answer `Reentrant`, destroying a QP is queued, and
//! dropping the engine there stops it without a join.

use std::net::IpAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uroce_provider::qp_attr::{AttrMask, ModifyError, QpAttr};
use uroce_provider::sans_io::engine::{Engine, EngineError};
use uroce_provider::sans_io::memory::KeyTable;
use uroce_provider::sans_io::transport::{Nanos, QpMachine, RxMeta, Transmit};
use uroce_provider::types::{QpState, QpType};
use uroce_wire::packet::ParsedPacket;

type Seen = (Result<QpAttr, EngineError>, Result<(), EngineError>, bool);

/// A QP that, the first time the engine polls it, uses the engine from
/// inside the poll and then drops the engine's last handle there.
struct Probe {
    qpn: u32,
    engine: Arc<Mutex<Option<Engine>>>,
    report: mpsc::Sender<Seen>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

impl QpMachine for Probe {
    fn qpn(&self) -> u32 {
        self.qpn
    }
    fn qp_type(&self) -> QpType {
        QpType::Ud
    }
    fn state(&self) -> QpState {
        QpState::Reset
    }
    fn attr(&self) -> QpAttr {
        QpAttr::default()
    }
    fn modify(&mut self, _: &QpAttr, _: AttrMask) -> Result<(), ModifyError> {
        Ok(())
    }
    fn handle_packet(&mut self, _: Nanos, _: &RxMeta, _: &ParsedPacket<'_>) {}
    fn poll_transmit(&mut self, _: Nanos, _: &mut [u8]) -> Option<Transmit> {
        let taken = self.engine.lock().unwrap().take();
        if let Some(engine) = taken {
            let own = engine.on_own_thread();
            let query = engine.query_qp(self.qpn);
            let destroy = engine.destroy_qp(self.qpn);
            // The last handle, dropped on the engine's own thread.
            drop(engine);
            let _ = self.report.send((query, destroy, own));
            // The engine thread (and its socket) outlive the report a
            // while: a restart must wait for them, not race them.
            std::thread::sleep(Duration::from_millis(300));
        }
        None
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        None
    }
    fn handle_timeout(&mut self, _: Nanos) {}
}

#[test]
fn the_engine_used_and_dropped_on_its_own_thread_neither_hangs_nor_joins() {
    let ip: IpAddr = "127.77.0.1".parse().unwrap();
    let engine = Engine::start(ip, Arc::new(KeyTable::new())).expect("bind");
    assert!(!engine.on_own_thread());
    let slot = Arc::new(Mutex::new(None));
    let (tx, rx) = mpsc::channel();
    let probe = Probe {
        qpn: 0x77,
        engine: slot.clone(),
        report: tx,
    };
    // Off the engine thread the same calls block and answer.
    engine.add_qp(probe).unwrap();
    assert_eq!(engine.query_qp(0x77).unwrap(), QpAttr::default());
    // Now hand the probe the only handle and let the engine poll it.
    let kicker = engine.kicker();
    *slot.lock().unwrap() = Some(engine);
    kicker.kick(0x77);
    let (query, destroy, own) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the engine thread hung in a call to itself");
    assert!(own, "the probe runs on the engine thread");
    assert_eq!(query, Err(EngineError::Reentrant));
    assert_eq!(destroy, Ok(()), "destroying is queued, not waited for");
    // The engine stopped without anyone joining it: a new engine on the
    // address waits for its socket to close, then binds at once.
    let again = Engine::start(ip, Arc::new(KeyTable::new()))
        .expect("the engine dropped on its own thread stopped and freed its address");
    assert!(again.query_qp(0x77).is_err());
}
