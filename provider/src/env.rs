//! Every `UROCE_*` environment variable the project reads, in one table.
//!
//! The table is the documentation's source: `docs/src/reference/environment.md`
//! and the `uroce(7)` man page are generated from it (the generator and
//! its freshness test are `verbs-api/cli/src/docgen.rs`, a unit test), and a
//! unit test below scans the workspace's Rust, C and shell sources and
//! fails when one of them names a `UROCE_*` variable the table lacks, or
//! the table names one nothing reads.
//!
//! Only the variables of [`Scope::Program`] and [`Scope::Command`] concern
//! a program that uses uroce; the others steer uroce's own tests,
//! benchmarks, fuzzers and interop matrix.

/// Who reads a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// The libraries every program links: the provider (through the Rust
    /// API or the drop-in `libibverbs.so.1`/`librdmacm.so.1`) and the
    /// preload shim.
    Program,
    /// The `uroce` command.
    Command,
    /// uroce's own test suites (`cargo test`, `tests/ibverbs`).
    Test,
    /// The benchmarks (`benches/`).
    Bench,
    /// The fuzzers (`fuzz/`).
    Fuzz,
    /// The interop matrix against kernel rxe (`tests/interop`).
    Interop,
}

impl Scope {
    /// Every scope, in the order the documentation lists them.
    pub const ALL: [Scope; 6] = [
        Scope::Program,
        Scope::Command,
        Scope::Test,
        Scope::Bench,
        Scope::Fuzz,
        Scope::Interop,
    ];

    /// The heading the documentation gives the scope's variables.
    pub fn title(self) -> &'static str {
        match self {
            Scope::Program => "Read by every program on uroce",
            Scope::Command => "Read by the uroce command",
            Scope::Test => "Read by uroce's tests",
            Scope::Bench => "Read by the benchmarks",
            Scope::Fuzz => "Read by the fuzzers",
            Scope::Interop => "Read by the interop matrix",
        }
    }
}

/// One environment variable: its name, who reads it, its default and
/// what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// The full name, `UROCE_...`.
    pub name: &'static str,
    /// Who reads it.
    pub scope: Scope,
    /// What holds when it is unset.
    pub default: &'static str,
    /// What it does, in a sentence or two.
    pub meaning: &'static str,
}

const fn var(
    name: &'static str,
    scope: Scope,
    default: &'static str,
    meaning: &'static str,
) -> Var {
    Var {
        name,
        scope,
        default,
        meaning,
    }
}

use Scope::{Bench, Command, Fuzz, Interop, Program, Test};

/// Every `UROCE_*` variable, grouped by scope.
pub const VARS: &[Var] = &[
    // --- every program ------------------------------------------------
    var(
        "UROCE_DEVICES",
        Program,
        "uroce0=127.0.0.1",
        "The devices a process sees, as `name=address,name=address,...`: each binds UDP 4791 \
         on its address (IPv4 or IPv6). Names and addresses must be unique.",
    ),
    var(
        "UROCE_FAULTS",
        Program,
        "no faults",
        "Faults applied to every packet the devices send, e.g. \
         `loss=0.05,reorder=0.1,dup=0.01,corrupt=0.001,delay=1ms,seed=7`, to test a program \
         against a bad network.",
    ),
    var(
        "UROCE_PCAP",
        Program,
        "no capture",
        "Every device writes its traffic (both directions) to this pcap file; `{dev}` in the \
         path becomes the device's name, e.g. `/tmp/{dev}.pcap`.",
    ),
    var(
        "UROCE_CHECK",
        Program,
        "off",
        "The verbs checker: `1` or `all` turns on every category, or a list of them \
         (`buffer,lifetime,queue,event,post`). Each report of an application mistake goes to \
         stderr with the call that made it.",
    ),
    var(
        "UROCE_EXPLAIN",
        Program,
        "off",
        "`1`: every error completion and every move of a QP to ERR is explained on stderr (the \
         check that failed, the side, keys, bounds, the NAK). The explanation is kept for \
         `uroce stat` either way.",
    ),
    var(
        "UROCE_TRACE",
        Program,
        "off",
        "Writes a timeline of the process's devices (Chrome/Perfetto trace JSON) to this file: \
         a track per QP, WR spans, packets, retransmissions, RNR waits, state changes.",
    ),
    var(
        "UROCE_STAT",
        Program,
        "on",
        "`0`: no live-state socket (`$XDG_RUNTIME_DIR/uroce/PID.sock`) and no thread serving \
         `uroce stat`.",
    ),
    var(
        "UROCE_COUNTERS",
        Program,
        "off",
        "Set (and not `0`): each device prints its non-zero counters on stderr when it closes, \
         for programs that cannot be asked.",
    ),
    var(
        "UROCE_GSO",
        Program,
        "on where the kernel has it",
        "`0`: no UDP segmentation offload (one packet per send call), e.g. so that a capture \
         on `lo` shows one packet per frame.",
    ),
    var(
        "UROCE_GRO",
        Program,
        "on where the kernel has it",
        "`0`: no UDP receive offload (one packet per receive call).",
    ),
    var(
        "UROCE_SHARE",
        Program,
        "on",
        "`0`: a device is not shared with other processes: its socket binds UDP 4791 alone (a \
         second process gets EADDRINUSE) and its QP numbers use all 24 bits.",
    ),
    var(
        "UROCE_APP_PROGRESS",
        Program,
        "on",
        "`0`: only the engine thread drives a device; application threads that poll do not.",
    ),
    var(
        "UROCE_STRICT_SOURCE_PORT",
        Program,
        "off",
        "`1`: RC and UC QPs created afterwards accept packets only from their peer's UDP \
         source port, not from any port of the peer's address.",
    ),
    var(
        "UROCE_CM_RESPONSE_TIMEOUT",
        Program,
        "rdma_cm's: 20",
        "The CM's response timeout as an IBA exponent (8..=31: 4.096 us x 2^N), for every \
         connection the process's CM agent starts.",
    ),
    var(
        "UROCE_CM_RETRIES",
        Program,
        "rdma_cm's: 15",
        "How often the CM resends a REQ, REP or DREQ that got no answer (1..=15).",
    ),
    var(
        "UROCE_SYSFS",
        Program,
        "unset",
        "The sysfs-like tree the preload shim (`liburoce_preload.so`) answers `/sys/class/\
         infiniband*` with (`uroce exec` sets it); without it nothing is redirected. With it \
         rdma_cm also takes an address of the interface the tree names as a device's netdev \
         (127.0.0.1 for `lo`) for the device itself, as the kernel binds and resolves a \
         loopback address.",
    ),
    var(
        "UROCE_IFADDRS",
        Program,
        "on",
        "`0`: the preload shim does not add uroce's loopback addresses to `getifaddrs()`.",
    ),
    // --- the uroce command --------------------------------------------
    var(
        "UROCE_DEBUG",
        Command,
        "off",
        "Set: when `uroce rc-stress` fails, it prints the QP's internal state on stderr.",
    ),
    // --- tests --------------------------------------------------------
    var(
        "UROCE_REQUIRE_VERBS_H",
        Test,
        "off",
        "Set: the layout tests fail instead of passing with a note when the installed \
         `verbs.h` or `rdma_cma.h` is missing (CI sets it).",
    ),
    var(
        "UROCE_BLESS",
        Test,
        "unset",
        "`1`: the generated-docs test (`verbs-api/cli/src/docgen.rs`) writes the man pages \
         and the book's reference pages instead of failing when they are out of date.",
    ),
    var(
        "UROCE_LARGE_MIB",
        Test,
        "256 (debug builds: 64)",
        "The size of the large-transfer loopback test's message, in MiB.",
    ),
    var(
        "UROCE_TEST_PCAP_CHILD",
        Test,
        "unset",
        "Internal: marks the child process of the `UROCE_PCAP` device-open test.",
    ),
    var(
        "UROCE_TEST_SHARE_CHILD",
        Test,
        "unset",
        "Internal: the device address of a member process of the device-sharing tests.",
    ),
    var(
        "UROCE_TEST_CM_SHARE_CHILD",
        Test,
        "unset",
        "Internal: the side (role, address, port, mode) a child process of rdma_cm's \
         device-sharing tests plays.",
    ),
    var(
        "UROCE_TEST_SHARE_OTHER_USER",
        Test,
        "unset",
        "Internal: the device address the other-user child of the device-sharing tests opens.",
    ),
    var(
        "UROCE_SERVER_DEVICES",
        Test,
        "unset",
        "The C test `cm_exit`: the server's `UROCE_DEVICES`.",
    ),
    var(
        "UROCE_CLIENT_DEVICES",
        Test,
        "unset",
        "The C test `cm_exit`: the client's `UROCE_DEVICES`.",
    ),
    var(
        "UROCE_CRATES_TARGET",
        Test,
        "~/.cache/uroce-crates-target",
        "`tests/crates/run.sh`: the target directory the published Rust RDMA crates are built \
         in.",
    ),
    // --- benchmarks ---------------------------------------------------
    var(
        "UROCE_BENCH_QUICK",
        Bench,
        "0",
        "`benches/perftest.sh`: `1` runs MTU 4096 only with 1 s measurements (what CI runs).",
    ),
    var(
        "UROCE_BENCH_SECS",
        Bench,
        "2 (quick: 1)",
        "`benches/perftest.sh`: seconds per throughput measurement.",
    ),
    var(
        "UROCE_BENCH_IDLE_SECS",
        Bench,
        "10 (quick: 5)",
        "`benches/perftest.sh`: the window the idle CPU is measured over.",
    ),
    var(
        "UROCE_BENCH_LAT_ITERS",
        Bench,
        "5000 x SECS",
        "`benches/perftest.sh`: latency round trips.",
    ),
    var(
        "UROCE_BENCH_NOBUILD",
        Bench,
        "0",
        "`benches/perftest.sh`: `1` uses target/release as it is, without a cargo build.",
    ),
    var(
        "UROCE_BENCH_KEEP",
        Bench,
        "0",
        "`benches/perftest.sh`: `1` keeps every program's output (the temporary directory).",
    ),
    var(
        "UROCE_BENCH_OUT",
        Bench,
        "unset",
        "`benches/perftest.sh`: also writes the tables (markdown) to this path.",
    ),
    var(
        "UROCE_BENCH_HISTORY",
        Bench,
        "1",
        "`benches/perftest.sh`: `0` keeps a full run from appending to benches/history.csv.",
    ),
    var(
        "UROCE_BENCH_NET",
        Bench,
        "90",
        "`benches/perftest.sh`: the second octet of every address it uses (127.N.x.y).",
    ),
    var(
        "UROCE_BENCH_PORT",
        Bench,
        "18900",
        "`benches/perftest.sh`: the first TCP port, less one, of perftest's handshakes.",
    ),
    var(
        "UROCE_DIAG_QUICK",
        Bench,
        "unset",
        "`benches/diag_cost.sh`: set, a quarter of the batches per workload.",
    ),
    var(
        "UROCE_FLOOD_PPS",
        Bench,
        "250000",
        "The `read_flood` bench: the attacker's pace in packets per second (0: unpaced).",
    ),
    var(
        "UROCE_MR_REG_N",
        Bench,
        "100000",
        "The `mr_reg` bench: registrations measured.",
    ),
    var(
        "UROCE_MR_REG_YARD",
        Bench,
        "2000",
        "The `mr_reg` bench: registrations of its yardstick.",
    ),
    var(
        "UROCE_QP_SCALE_QPS",
        Bench,
        "1000",
        "The `qp_scale` bench: QP pairs.",
    ),
    var(
        "UROCE_QP_SCALE_SECS",
        Bench,
        "2",
        "The `qp_scale` bench: seconds per run.",
    ),
    var(
        "UROCE_QP_SCALE_NET",
        Bench,
        "90",
        "The `qp_scale` bench: the second octet of its addresses (127.N.x.y).",
    ),
    // --- fuzzers ------------------------------------------------------
    var(
        "UROCE_FUZZ_LIVE",
        Fuzz,
        "unset",
        "`uroce-fuzz`'s live test: `TARGET_IP,FUZZER_IP,AGENT_ADDR` of a device under \
         `uroce-fuzz-agent`; unset, the test runs on the simulated target.",
    ),
    var(
        "UROCE_FUZZ_CASES",
        Fuzz,
        "150",
        "`uroce-fuzz`'s campaign test: cases per mode, for a longer run.",
    ),
    var(
        "UROCE_SIM_CASE_REPORT",
        Fuzz,
        "unset",
        "The `sim_case` fuzz target: set, a reference-model rejection is printed and counted \
         instead of failing (for triage runs).",
    ),
    var(
        "UROCE_MODEL_SURVEY",
        Fuzz,
        "unset",
        "The model's survey test: N cases whose verdicts it prints.",
    ),
    var(
        "UROCE_MODEL_SURVEY_POSTS",
        Fuzz,
        "unset",
        "The model's survey test: set, the responder mode's posts alone.",
    ),
    var(
        "UROCE_MODEL_SEED",
        Fuzz,
        "7",
        "The model's survey test: the first seed.",
    ),
    var(
        "UROCE_MODEL_FINDING",
        Fuzz,
        "unset",
        "A finding file that the model test runs on the sim target and prints the verdict of.",
    ),
    var(
        "UROCE_MODEL_REPLAY",
        Fuzz,
        "unset",
        "A `sim_case` input the model test replays, printing each step's verdict.",
    ),
    var(
        "UROCE_MATRIX_ONE_DEVICE",
        Test,
        "unset",
        "`tests/ibverbs/matrix.sh`: `all` runs every ping-pong and perftest pair again on one \
         shared device, not only the default subset.",
    ),
    var(
        "UROCE_MATRIX_ONE_DEVICE_CM",
        Test,
        "unset",
        "`tests/ibverbs/rdmacm.sh`: set, every rdma_cm pair also runs with server and client on \
         one shared device, not only the default subset.",
    ),
    // --- interop ------------------------------------------------------
    var(
        "UROCE_INTEROP_QUICK",
        Interop,
        "unset (CI: 1)",
        "`tests/interop/run.sh`: set, the subset CI runs (fewer ping-pong sizes, no 1 MiB at \
         MTU 1024 under loss, the SRQ ping-pong at MTU 4096 without loss only).",
    ),
    var(
        "UROCE_CI_FULL",
        Test,
        "unset",
        "`.ci/run`: set, the longest stages whole instead of CI's subsets: the cargo-fuzz \
         targets twice as long and `rc_pair` under ASan, the whole interop matrix, 8 s uroce \
         fuzz runs against rxe (CI: 5 s; 4 s on 6.12).",
    ),
    var(
        "UROCE_INTEROP_KERNEL",
        Interop,
        "6.1 (Debian bookworm's)",
        "`tests/interop/run.sh`: the guest's kernel (`6.1`, `6.12` or a /lib/modules name).",
    ),
    var(
        "UROCE_INTEROP_ACCEL",
        Interop,
        "auto",
        "`tests/interop/run.sh`: `kvm` or `tcg` forces the guest's accelerator.",
    ),
    var(
        "UROCE_INTEROP_KEEP",
        Interop,
        "unset",
        "`tests/interop/run.sh`: `1` keeps the run directory with its logs and captures.",
    ),
    var(
        "UROCE_INTEROP_REPEAT",
        Interop,
        "1",
        "`tests/interop/run.sh`: runs each chosen scenario N times (to catch a rare failure).",
    ),
    var(
        "UROCE_INTEROP_NETEM",
        Interop,
        "loss 2% delay 1ms reorder 10%",
        "`tests/interop/run.sh`: the guest's impairment for the lossy scenarios.",
    ),
];

/// The entry for `name`, if the table has one.
pub fn lookup(name: &str) -> Option<&'static Var> {
    VARS.iter().find(|v| v.name == name)
}

/// Whether the switch `name`, on by default, is turned off: set to `0`
/// (surrounding blanks aside).
pub fn turned_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    /// The workspace root: the provider's parent.
    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("provider/ has a parent")
            .to_path_buf()
    }

    /// Sources that may read a variable: Rust, C, shell, Python and the
    /// CI script. Build output, fuzz corpora and generated docs are not
    /// sources.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if p.is_dir() {
                if !matches!(
                    name.as_ref(),
                    "target" | ".git" | "corpus" | "artifacts" | "docs" | "coverage"
                ) {
                    sources(&p, out);
                }
            } else if name == "run"
                || [".rs", ".c", ".h", ".sh", ".py"]
                    .iter()
                    .any(|x| name.ends_with(x))
            {
                out.push(p);
            }
        }
    }

    /// Every `UROCE_[A-Z0-9_]+` word in `text`, less C include guards
    /// (`#ifndef UROCE_..._H`), which are no variables.
    fn names_in(text: &str, out: &mut BTreeSet<String>) {
        let b = text.as_bytes();
        let mut i = 0;
        while let Some(at) = text[i..].find("UROCE_") {
            let start = i + at;
            let mut end = start + "UROCE_".len();
            while end < b.len()
                && (b[end].is_ascii_uppercase() || b[end].is_ascii_digit() || b[end] == b'_')
            {
                end += 1;
            }
            let before_ok =
                start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
            let word = &text[start..end];
            let guard = word.ends_with("_H") && {
                let line_start = text[..start].rfind('\n').map_or(0, |n| n + 1);
                text[line_start..start].trim_start().starts_with('#')
            };
            if before_ok && word.len() > "UROCE_".len() && !word.ends_with('_') && !guard {
                out.insert(word.to_string());
            }
            i = end;
        }
    }

    fn named_in_sources() -> BTreeSet<String> {
        let mut files = Vec::new();
        let root = root();
        for d in [
            "wire",
            "provider",
            "verbs-api",
            "tests",
            "fuzz",
            "benches",
            ".ci",
        ] {
            sources(&root.join(d), &mut files);
        }
        assert!(
            files.len() > 100,
            "found only {} source files under {}",
            files.len(),
            root.display()
        );
        let mut names = BTreeSet::new();
        for f in files {
            // This file names every variable by construction.
            if f.ends_with("provider/src/env.rs") {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(&f) {
                names_in(&text, &mut names);
            }
        }
        names
    }

    #[test]
    fn every_variable_a_source_names_is_in_the_table() {
        let missing: Vec<String> = named_in_sources()
            .into_iter()
            .filter(|n| lookup(n).is_none())
            .collect();
        assert!(
            missing.is_empty(),
            "read in the sources but missing from provider/src/env.rs's VARS: {missing:?}"
        );
    }

    #[test]
    fn every_variable_in_the_table_is_read_somewhere() {
        let named = named_in_sources();
        let stale: Vec<&str> = VARS
            .iter()
            .map(|v| v.name)
            .filter(|n| !named.contains(*n))
            .collect();
        assert!(
            stale.is_empty(),
            "in VARS but named by no source: {stale:?}"
        );
    }

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = BTreeSet::new();
        for v in VARS {
            assert!(seen.insert(v.name), "{} twice", v.name);
            assert!(v.name.starts_with("UROCE_"), "{}", v.name);
            assert!(!v.meaning.is_empty() && !v.default.is_empty(), "{}", v.name);
        }
    }

    #[test]
    fn the_scanner_finds_reads_and_skips_guards() {
        let mut s = BTreeSet::new();
        names_in(
            "std::env::var(\"UROCE_ALPHA\")\n${UROCE_BETA:-1}\n#ifndef UROCE_X_H\nXUROCE_NO\nUROCE_\n",
            &mut s,
        );
        let got: Vec<&str> = s.iter().map(String::as_str).collect();
        assert_eq!(got, ["UROCE_ALPHA", "UROCE_BETA"]);
    }
}
