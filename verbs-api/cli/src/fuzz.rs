//! `uroce fuzz`: the command line of the RoCEv2 fuzzer, whose engine is
//! [`uroce_fuzz`].

use clap::{Args, Subcommand};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use uroce_fuzz::gen::Mode;
use uroce_fuzz::replay::Options as ReplayOptions;
use uroce_fuzz::session::{self, TargetSpec};
use uroce_fuzz::Config;
use uroce_verbs::QpType;

/// The target options, shared by a run and a replay.
#[derive(Args, Debug, Clone)]
pub struct TargetArgs {
    /// `sim` (uroce's QP machines on the simulated network), `sim:BUG`
    /// with a planted bug (`write-inside-send`, `long-read`,
    /// `ghost-ack`, `window-any-qp`), or
    /// `udp:IP` (a live RoCEv2 device at IP, observed through
    /// uroce-fuzz-agent).
    #[arg(long, default_value = "sim")]
    pub target: String,
    /// The address the fuzzer sends from (a udp target; binds :4791).
    #[arg(long)]
    pub fuzzer: Option<IpAddr>,
    /// The agent's TCP address (a udp target), e.g. 10.0.0.2:4792.
    #[arg(long)]
    pub agent: Option<SocketAddr>,
}

impl TargetArgs {
    fn spec(&self) -> Result<TargetSpec, String> {
        TargetSpec::parse(&self.target, self.fuzzer, self.agent)
    }
}

/// `uroce fuzz`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FuzzArgs {
    /// Replay a finding instead of fuzzing.
    #[command(subcommand)]
    pub sub: Option<FuzzSub>,
    /// The target.
    #[command(flatten)]
    pub target: TargetArgs,
    /// Transport of the fuzzed QP: rc, uc or ud.
    #[arg(long, default_value = "rc")]
    pub qp: String,
    /// `fields` (single packets, every header field mutated),
    /// `sequence` (stateful request sequences), `responder` (the target
    /// posts requests; RC: the fuzzer answers them, mutated; UC, UD: the
    /// posts alone), `keys`
    /// (requests with the target's other keys: rights lacking, another
    /// PD, deregistered, windows; UD: Q_Key and source-QP mismatches) or
    /// `duplicates` (duplicates, PSNs ahead, messages interrupted, for
    /// every opcode class).
    #[arg(long, default_value = "fields")]
    pub mode: String,
    /// Seed: the same seed makes the same cases.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Cases to run at most.
    #[arg(long, default_value_t = 1000)]
    pub cases: u64,
    /// Stop after this many seconds.
    #[arg(long)]
    pub time: Option<u64>,
    /// Directory for findings (JSON, pcap).
    #[arg(long, default_value = "uroce-fuzz-findings")]
    pub out: PathBuf,
    /// Keep findings as found (no shrinking).
    #[arg(long)]
    pub no_minimize: bool,
    /// Receive WRs posted on the fuzzed QP per case.
    #[arg(long, default_value_t = 8)]
    pub recvs: u32,
    /// Leave out the packets known to crash kernel rxe (an RDMA WRITE
    /// whose RETH names a DMA length of 0 but which carries a payload;
    /// `fuzz/cases/`), so that a campaign against it runs on.
    #[arg(long)]
    pub skip_known_crashes: bool,
    /// Differential: run every case on this second target too (`sim`,
    /// `udp:IP`) and report where the two differ.
    #[arg(long)]
    pub versus: Option<String>,
    /// The fuzzer's address towards the second target (udp).
    #[arg(long)]
    pub versus_fuzzer: Option<IpAddr>,
    /// The second target's agent (udp).
    #[arg(long)]
    pub versus_agent: Option<SocketAddr>,
}

/// `uroce fuzz replay`, `uroce fuzz pcap`.
#[derive(Subcommand, Debug)]
pub enum FuzzSub {
    /// Replays a saved finding against a target (rewritten for the live
    /// connection) and reports which oracles it trips.
    Replay {
        /// The finding's JSON file.
        file: PathBuf,
        /// The target.
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Runs ReDMArk's attacks (QPN scan, PSN sweep, rkey guessing,
    /// spoofed source, one-packet QP kill, READ amplification, resource
    /// exhaustion) and reports each as prevented, detected or succeeded.
    Attack {
        /// Attacks to run, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        which: Vec<String>,
        /// Transport of the attacked QP: rc or uc.
        #[arg(long, default_value = "rc")]
        qp: String,
        /// Packets each attack may send at most.
        #[arg(long, default_value_t = 1024)]
        budget: u64,
        /// The spoofed source address (default: the fuzzer's with its
        /// last bit flipped).
        #[arg(long)]
        spoof: Option<IpAddr>,
        /// The target.
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Replays a capture (pcap or pcapng) against a target: one flow's
    /// requests, rewritten to the live connection (QP, PSNs, rkey,
    /// addresses), then optionally mutants of them.
    Pcap {
        /// The capture file.
        file: PathBuf,
        /// The flow to replay, by its number in the listing (default:
        /// the one with the most requests).
        #[arg(long)]
        flow: Option<usize>,
        /// Also run this many mutants of the replayed case (1 to 3
        /// packets' fields mutated each); findings are minimized and saved.
        #[arg(long, default_value_t = 0)]
        mutate: u64,
        /// Seed of the mutants.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Transport of the live QP: rc, uc or ud (default: the flow's).
        #[arg(long)]
        qp: Option<String>,
        /// Directory for findings (JSON, pcap).
        #[arg(long, default_value = "uroce-fuzz-findings")]
        out: PathBuf,
        /// The target.
        #[command(flatten)]
        target: TargetArgs,
    },
}

fn qp_type(s: &str) -> Option<QpType> {
    match s {
        "rc" => Some(QpType::Rc),
        "uc" => Some(QpType::Uc),
        "ud" => Some(QpType::Ud),
        _ => None,
    }
}

/// Runs `uroce fuzz`: exit status 0 with no finding, 1 with findings (or
/// a replay that still trips an oracle), 2 when it could not run (an
/// attack run: 0 when it ran).
pub fn run(a: FuzzArgs) -> ExitCode {
    let mut out = std::io::stdout();
    if let Some(FuzzSub::Replay { file, target }) = a.sub {
        let spec = match target.spec() {
            Ok(s) => s,
            Err(e) => return fail(&e),
        };
        return exit(session::replay(&file, &spec, &mut out));
    }
    if let Some(FuzzSub::Pcap {
        file,
        flow,
        mutate,
        seed,
        qp,
        out: dir,
        target,
    }) = a.sub
    {
        let spec = match target.spec() {
            Ok(s) => s,
            Err(e) => return fail(&e),
        };
        let qp_type = match qp.as_deref().map(|q| (q, qp_type(q))) {
            None => None,
            Some((_, Some(t))) => Some(t),
            Some((q, None)) => return fail(&format!("--qp {q}: rc, uc or ud")),
        };
        let opts = ReplayOptions {
            flow,
            qp_type,
            mutate,
            seed,
        };
        return exit(session::replay_pcap(&file, &opts, &spec, &dir, &mut out));
    }
    if let Some(FuzzSub::Attack {
        which,
        qp,
        budget,
        spoof,
        target,
    }) = a.sub
    {
        return attack(&which, &qp, budget, spoof, &target);
    }
    let spec = match a.target.spec() {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let Some(qp_type) = qp_type(&a.qp) else {
        return fail(&format!("--qp {}: rc, uc or ud", a.qp));
    };
    let Some(mode) = Mode::from_name(&a.mode) else {
        return fail(&format!("--mode {}: {}", a.mode, Mode::NAMES.join(", ")));
    };
    let cfg = Config {
        seed: a.seed,
        mode,
        qp_type,
        cases: a.cases,
        time_limit: a.time.map(Duration::from_secs),
        minimize: !a.no_minimize,
        recvs: a.recvs,
        skip_known_crashes: a.skip_known_crashes,
    };
    if let Some(v) = &a.versus {
        let other = match TargetSpec::parse(v, a.versus_fuzzer, a.versus_agent) {
            Ok(s) => s,
            Err(e) => return fail(&format!("--versus: {e}")),
        };
        return match session::run_diff(&spec, &other, &cfg, &a.out, &mut out) {
            Ok(r) if r.findings.is_empty() => ExitCode::SUCCESS,
            Ok(_) => ExitCode::from(1),
            Err(e) => fail(&e.to_string()),
        };
    }
    match session::run(&spec, &cfg, &a.out, &mut out) {
        Ok(r) if r.findings.is_empty() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => fail(&e.to_string()),
    }
}

/// `uroce fuzz attack`: exit 0 when the attacks ran (whatever their
/// verdicts), 2 when they could not.
fn attack(
    which: &[String],
    qp: &str,
    budget: u64,
    spoof: Option<IpAddr>,
    target: &TargetArgs,
) -> ExitCode {
    use uroce_fuzz::attack::{names, AttackConfig};
    let spec = match target.spec() {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let qp_type = match qp_type(qp) {
        Some(t @ (QpType::Rc | QpType::Uc)) => t,
        _ => return fail(&format!("--qp {qp}: rc or uc")),
    };
    let which: Vec<&str> = which.iter().map(|s| s.as_str()).collect();
    if let Some(w) = which.iter().find(|w| !names().contains(w)) {
        return fail(&format!("--which {w}: {}", names().join(", ")));
    }
    let cfg = AttackConfig {
        qp_type,
        budget,
        spoof,
    };
    match session::attacks(&spec, &cfg, &which, &mut std::io::stdout()) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

/// 0: nothing tripped, 1: oracles tripped or findings, 2: could not run.
fn exit(r: Result<usize, String>) -> ExitCode {
    match r {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => fail(&e),
    }
}

fn fail(e: &str) -> ExitCode {
    eprintln!("uroce fuzz: {e}");
    ExitCode::from(2)
}
