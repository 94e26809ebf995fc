//! The planted-mistake battery (`uroce_fuzz::battery`): every planted
//! mistake of the provider must be found by the documented fuzz modes
//! against the simulated target, except those listed as missed (known),
//! and the clean target must give no finding with the same budgets.
//!
//! ```sh
//! cargo test -p uroce-fuzz --features planted --release --test battery -- --nocapture
//! ```
//!
//! Needs the feature `planted` (Cargo.toml's `required-features`): a
//! plain `cargo test --workspace` does not build it.

use uroce_fuzz::battery::{self, RUNS};

#[test]
fn every_planted_mistake_is_found_and_the_clean_target_passes() {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let outcomes = battery::run_all(RUNS, threads);
    let mut text = Vec::new();
    let verdict = battery::report(&outcomes, &mut text);
    let text = String::from_utf8_lossy(&text);
    println!("\n{text}");
    assert!(
        verdict.clean_finding.is_none(),
        "the clean target has a finding: {:?}",
        verdict.clean_finding
    );
    let missed: Vec<&str> = verdict.unexpected_misses.iter().map(|m| m.name()).collect();
    assert!(
        missed.is_empty(),
        "planted mistakes missed (not listed as missed (known)): {}\n{text}",
        missed.join(", ")
    );
}

mod witness {
    //! Each planted mistake is one a peer can observe: a hand-made case
    //! whose answers or observation differ between the clean target and
    //! the planted one (so a miss of the battery is the oracles' miss,
    //! not a mistake nobody could see).

    use uroce_fuzz::case::{Case, Key, PacketSpec, Post, PostOp, Step};
    use uroce_fuzz::run_case;
    use uroce_fuzz::sim::{PlantedBug, SimTarget};
    use uroce_fuzz::target::Observation;
    use uroce_provider::planted::Mistake;
    use uroce_provider::types::QpType;
    use uroce_wire::Opcode;

    fn pkt(op: Opcode, psn: i32, len: u16) -> PacketSpec {
        let mut p = PacketSpec::new(op, psn);
        p.payload = (len, 0x11);
        p
    }

    fn with_reth(mut p: PacketSpec, off: i64, key: Key, dma: u32) -> PacketSpec {
        p.reth = Some((off, key, dma));
        p
    }

    fn resp(op: Opcode, psn: i32, syndrome: u8, len: u16) -> PacketSpec {
        let mut p = PacketSpec::response(op, psn);
        p.aeth = Some((syndrome, 1));
        p.payload = (len, 0x22);
        p
    }

    fn post(wr_id: u64, op: PostOp, len: u32) -> Step {
        Step::Post(Post {
            wr_id,
            op,
            len,
            local_off: 64 * wr_id as u32,
            remote_va: 0x1000,
            rkey: 0x4242,
            swap_add: 1,
            compare: 0,
        })
    }

    /// A case that shows `m`: its transport, receive WRs and steps.
    /// `None`: the target does not expose what it needs yet.
    fn witness(m: Mistake) -> Option<(QpType, u32, Vec<Step>)> {
        use Opcode as O;
        let p = Step::Packet;
        let rc = |steps| Some((QpType::Rc, 8, steps));
        match m {
            Mistake::DuplicateExecuted => rc(vec![
                p(pkt(O::RC_SEND_ONLY, 0, 10)),
                p(pkt(O::RC_SEND_ONLY, 0, 10)),
            ]),
            Mistake::DuplicateAtomicExecuted => {
                let mut a = pkt(O::RC_FETCH_ADD, 0, 0);
                a.atomic = Some((0, Key::Valid, 1, 0));
                rc(vec![p(a.clone()), p(a)])
            }
            Mistake::SeqNakEveryPacket => rc(vec![
                p(pkt(O::RC_SEND_ONLY, 2, 10)),
                p(pkt(O::RC_SEND_ONLY, 3, 10)),
            ]),
            Mistake::MsnNotAdvancedOnRead => rc(vec![
                p(with_reth(
                    pkt(O::RC_RDMA_READ_REQUEST, 0, 0),
                    0,
                    Key::Valid,
                    8,
                )),
                p(pkt(O::RC_SEND_ONLY, 1, 10)),
            ]),
            Mistake::WriteImmWrongByteLen => rc(vec![
                p(with_reth(
                    pkt(O::RC_RDMA_WRITE_FIRST, 0, 1024),
                    0,
                    Key::Valid,
                    2048,
                )),
                p(pkt(O::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 1, 1024)),
            ]),
            Mistake::ReadLastFullMtu => rc(vec![p(with_reth(
                pkt(O::RC_RDMA_READ_REQUEST, 0, 0),
                0,
                Key::Valid,
                10,
            ))]),
            Mistake::RnrNakWrongTimer => Some((
                QpType::Rc,
                0,
                vec![p(pkt(O::RC_SEND_ONLY, 0, 10)), Step::Wait(100)],
            )),
            Mistake::NoErrorOnAccessError => rc(vec![p(with_reth(
                pkt(O::RC_RDMA_WRITE_ONLY, 0, 8),
                0,
                Key::Raw(0x0bad_0bad),
                8,
            ))]),
            Mistake::AckUnexecutedPsn => rc(vec![p(pkt(O::RC_SEND_ONLY, 0, 10))]),
            Mistake::ImpliedNakIgnored => rc(vec![
                post(1, PostOp::Read, 8),
                post(2, PostOp::Send, 8),
                Step::Wait(100),
                p(resp(O::RC_ACKNOWLEDGE, 1, 0x1f, 0)),
            ]),
            Mistake::NakAcknowledgesItsPsn => rc(vec![
                post(1, PostOp::Send, 8),
                Step::Wait(100),
                // NAK: remote access error.
                p(resp(O::RC_ACKNOWLEDGE, 0, 0x62, 0)),
            ]),
            Mistake::AtomicAckAnyPsn => {
                let mut ack = resp(O::RC_ATOMIC_ACKNOWLEDGE, 1, 0x1f, 0);
                ack.atomic_ack = Some(7);
                rc(vec![
                    post(1, PostOp::FetchAdd, 8),
                    post(2, PostOp::Send, 8),
                    Step::Wait(100),
                    p(ack),
                ])
            }
            Mistake::UcMiddleWithoutFirst => {
                Some((QpType::Uc, 8, vec![p(pkt(O::UC_SEND_LAST, 0, 10))]))
            }
            Mistake::UcGapContinues => Some((
                QpType::Uc,
                8,
                vec![
                    p(pkt(O::UC_SEND_FIRST, 0, 1024)),
                    p(pkt(O::UC_SEND_LAST, 2, 10)),
                ],
            )),
            Mistake::UdQkeyUnchecked => {
                let mut d = pkt(O::UD_SEND_ONLY, 0, 10);
                d.deth = Some((Some(0x1234), 0x777));
                Some((QpType::Ud, 8, vec![p(d)]))
            }
            Mistake::UdByteLenWithoutGrh => {
                let mut d = pkt(O::UD_SEND_ONLY, 0, 10);
                d.deth = Some((None, 0x777));
                Some((QpType::Ud, 8, vec![p(d)]))
            }
            Mistake::WriteWithoutRemoteWrite => rc(vec![p(with_reth(
                pkt(O::RC_RDMA_WRITE_ONLY, 0, 8),
                0,
                Key::Exposed(0),
                8,
            ))]),
            Mistake::OtherPdKeyAccepted => rc(vec![p(with_reth(
                pkt(O::RC_RDMA_WRITE_ONLY, 0, 8),
                0,
                Key::Exposed(4),
                8,
            ))]),
            Mistake::RkeyBoundsOffByOne => rc(vec![p(with_reth(
                pkt(O::RC_RDMA_READ_REQUEST, 0, 0),
                4096 - 2047,
                Key::Valid,
                2048,
            ))]),
        }
    }

    /// What a peer sees of a run: the answers, and the observation.
    fn seen(
        bug: Option<PlantedBug>,
        qp: QpType,
        recvs: u32,
        case: &Case,
    ) -> (Vec<Vec<u8>>, Observation) {
        let mut t = SimTarget::new(9, bug);
        let out = run_case(&mut t, qp, recvs, case).expect("sim target");
        let answers = out
            .packets
            .iter()
            .filter(|p| !p.sent)
            .map(|p| p.bytes.clone())
            .collect();
        (answers, out.obs)
    }

    #[test]
    fn every_planted_mistake_shows_on_the_wire_or_in_the_observation() {
        let mut blind = Vec::new();
        for &m in Mistake::ALL {
            let Some((qp, recvs, steps)) = witness(m) else {
                blind.push(format!("{m}: no witness case on this target"));
                continue;
            };
            let case = Case { steps };
            let clean = seen(None, qp, recvs, &case);
            let planted = seen(Some(PlantedBug::Mistake(m)), qp, recvs, &case);
            if clean == planted {
                blind.push(format!("{m}: same answers and observation"));
            }
        }
        println!("not observable here: {blind:#?}");
        assert!(blind.is_empty(), "{blind:#?}");
    }
}
