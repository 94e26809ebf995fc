//! The stateful fuzz harness (`uroce_fuzz::pair`) as a property
//! test: random scripts of posts, forged packets, drops and time for an
//! RC, a UC and a UD pair, with the invariants checked after every step.
//! cargo-fuzz runs the same harness with coverage guidance
//! (`fuzz/fuzz_targets/{rc,uc,ud}_pair.rs`).

use proptest::prelude::*;
use uroce_fuzz::pair::run;
use uroce_provider::types::QpType;

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cases())]
    #[test]
    fn rc_pair_invariants(data in proptest::collection::vec(any::<u8>(), 0..768)) {
        run(QpType::Rc, &data);
    }
    #[test]
    fn uc_pair_invariants(data in proptest::collection::vec(any::<u8>(), 0..768)) {
        run(QpType::Uc, &data);
    }
    #[test]
    fn ud_pair_invariants(data in proptest::collection::vec(any::<u8>(), 0..768)) {
        run(QpType::Ud, &data);
    }
}

/// The committed seeds (fuzz/seeds_pair) still pass.
#[test]
fn committed_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../seeds_pair");
    // The seeds are committed beside the crate: a missing directory is a
    // wrong path, not a reason to pass.
    let rd = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut n = 0;
    for e in rd.flatten() {
        n += 1;
        let name = e.file_name().to_string_lossy().into_owned();
        let data = std::fs::read(e.path()).unwrap();
        let kind = match name.split('_').next() {
            Some("uc") => QpType::Uc,
            Some("ud") => QpType::Ud,
            _ => QpType::Rc,
        };
        eprintln!("seed {name}");
        run(kind, &data);
    }
    assert!(n > 0, "no seeds in {}", dir.display());
}
