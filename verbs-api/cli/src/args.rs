//! The `uroce` command line: every subcommand, flag, default and help
//! text, as clap reads them. `src/bin/uroce.rs` parses it and dispatches;
//! a test or a generator (man pages, with clap_mangen) takes the whole
//! definition from [`Cli::command`](clap::CommandFactory::command).

use clap::{Parser, Subcommand};
use std::net::IpAddr;
use std::path::PathBuf;

/// `uroce`: the command and its subcommand.
#[derive(Parser)]
#[command(
    name = "uroce",
    version,
    about = "Userspace RoCEv2: RDMA verbs without hardware or root"
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Cmd {
    /// Two devices on loopback addresses in one process, an RC QP pair,
    /// and every RC operation verified and timed.
    Demo {
        /// Address of the first device.
        #[arg(long, default_value = "127.0.0.1")]
        a: IpAddr,
        /// Address of the second device.
        #[arg(long, default_value = "127.0.0.2")]
        b: IpAddr,
        /// Ping-pong and atomic iterations.
        #[arg(short = 'n', long, default_value_t = 1000)]
        iters: u32,
        /// MiB moved by the RDMA WRITE and READ runs.
        #[arg(long, default_value_t = 256)]
        mib: usize,
        /// Also print the devices' counters.
        #[arg(long)]
        stats: bool,
        /// Write uroce0's traffic (both directions) to this pcap file.
        #[arg(long)]
        pcap: Option<std::path::PathBuf>,
    },
    /// List the configured devices (UROCE_DEVICES) with their GIDs.
    Devices,
    /// Merges traces that UROCE_TRACE wrote (one per process, e.g. both
    /// ends of a pair) into one file for Perfetto or chrome://tracing.
    #[command(name = "trace-merge")]
    TraceMerge {
        /// The trace files.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// The merged trace.
        #[arg(short = 'o', long)]
        out: std::path::PathBuf,
    },
    /// The live state of every uroce process of this user (or of one):
    /// devices, PDs, MRs, CQs, SRQs, QPs and counters, as `rdma resource
    /// show` and `rdma statistic` show kernel devices. Each process
    /// serves it on $XDG_RUNTIME_DIR/uroce/PID.sock (or /tmp/uroce-UID/)
    /// unless run with UROCE_STAT=0.
    Stat {
        /// Only this process.
        pid: Option<u32>,
        /// Print JSON (an array of processes) instead of text.
        #[arg(long)]
        json: bool,
        /// Print again every second until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// A stateful RoCEv2 fuzzer: plays the peer of a target (uroce's QP
    /// machines on the simulated network, or any RoCEv2 device through
    /// uroce-fuzz-agent), checks oracles after every case, minimizes
    /// and saves findings (JSON, pcap, the replay command).
    Fuzz(Box<crate::fuzz::FuzzArgs>),
    /// rdma-core's rdma_server / rdma_client exchange through the
    /// connection manager (RDMA_PS_TCP, port 7471): the client sends 16
    /// bytes, the server answers with 16 (echoing them). Works against
    /// Debian's rdma_server / rdma_client.
    #[command(name = "cm-echo")]
    CmEcho {
        /// Server to connect to (none: be the server).
        server: Option<IpAddr>,
        /// Port.
        #[arg(short = 'p', long, default_value_t = crate::cm_echo::PORT)]
        port: u16,
        /// Local address: the server binds it (default: 0.0.0.0, every
        /// device), the client connects from it.
        #[arg(short = 'b', long)]
        bind: Option<IpAddr>,
        /// Client: require the echo of what was sent (a uroce server).
        #[arg(long)]
        verify: bool,
    },
    /// The directory holding uroce's libibverbs.so.1:
    /// `LD_LIBRARY_PATH=$(uroce libdir) ibv_devinfo`.
    Libdir,
    /// Runs a program on uroce: LD_LIBRARY_PATH as `uroce libdir` gives
    /// it, and liburoce_preload.so preloaded so that programs which look
    /// for a device node in /dev/infiniband (UCX) or read its files in
    /// /sys/class/infiniband (GID types, ports, netdevs) find uroce's
    /// devices, without root, and in LD_AUDIT so that a libibverbs or
    /// librdmacm loaded by any other name or path (a Python wheel's
    /// bundled copy) is uroce's: `uroce exec -- ucx_info -d`.
    Exec {
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Every RC operation between two processes or hosts, every byte
    /// verified: run the server first, then the client with the server's
    /// address.
    #[command(name = "rc-stress")]
    RcStress(StressArgs),
    /// rdma-core's ibv_rc_pingpong on uroce: same options, exchange and output.
    #[command(name = "rc-pingpong")]
    RcPingpong(RcPingPongArgs),
    /// rdma-core's ibv_uc_pingpong on uroce: same options, exchange and output.
    #[command(name = "uc-pingpong")]
    UcPingpong {
        /// The options every ping-pong tool takes.
        #[command(flatten)]
        common: PingPongArgs,
        /// Path MTU.
        #[arg(short = 'm', long, default_value_t = 1024)]
        mtu: u32,
    },
    /// rdma-core's ibv_ud_pingpong on uroce: same options, exchange and
    /// output (Q_Key 0x11111111, data after the 40-byte GRH area).
    #[command(name = "ud-pingpong")]
    UdPingpong {
        /// The options every ping-pong tool takes.
        #[command(flatten)]
        common: PingPongArgs,
    },
    /// rdma-core's ibv_srq_pingpong on uroce: same options, exchange and
    /// output (-q RC QPs sharing one SRQ).
    #[command(name = "srq-pingpong")]
    SrqPingpong {
        /// The options every ping-pong tool takes.
        #[command(flatten)]
        common: PingPongArgs,
        /// Path MTU.
        #[arg(short = 'm', long, default_value_t = 1024)]
        mtu: u32,
        /// Number of QPs.
        #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
        num_qp: u32,
        /// On-demand paging (not supported).
        #[arg(short = 'o', long)]
        odp: bool,
    },
    /// Print every RoCEv2 packet (UDP port 4791) of a pcap or pcapng
    /// capture as one JSON object per line, ICRC checked.
    Decode {
        /// The capture file.
        file: PathBuf,
    },
    /// Write a pcap holding one packet of every RoCEv2 opcode (IPv4 and
    /// IPv6 unless one is chosen), e.g. for `uroce decode`.
    #[command(name = "sample-pcap")]
    SamplePcap {
        /// The capture file to write.
        file: PathBuf,
        /// IPv4 packets only.
        #[arg(long, conflicts_with = "ipv6")]
        ipv4: bool,
        /// IPv6 packets only.
        #[arg(long)]
        ipv6: bool,
    },
}

/// The options every ping-pong tool takes.
#[derive(clap::Args)]
pub struct PingPongArgs {
    /// Connect to the server at this host (no host: be the server).
    pub server: Option<String>,
    /// Listen on/connect to this TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    pub port: u16,
    /// Use this device (default: the first one).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Use this port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Size of the message to exchange (default 4096; UD 1024).
    #[arg(short = 's', long)]
    pub size: Option<usize>,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub iters: u32,
    /// Service level.
    #[arg(short = 'l', long, default_value_t = 0)]
    pub sl: u8,
    /// Sleep while waiting for completions (default: poll).
    #[arg(short = 'e', long)]
    pub events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u32>,
    /// Validate the received buffer.
    #[arg(short = 'c', long)]
    pub chk: bool,
}

/// `uroce rc-stress`'s options.
#[derive(clap::Args)]
pub struct StressArgs {
    /// Server to connect to (no host: be the server).
    pub server: Option<String>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18516)]
    pub port: u16,
    /// Device (default: the first configured).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Messages to send (client).
    #[arg(short = 'n', long, default_value_t = 10000)]
    pub messages: u64,
    /// Seed of the operation mix (client).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Path MTU.
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// Local ACK timeout exponent (4.096 us x 2^t).
    #[arg(short = 't', long, default_value_t = 14)]
    pub timeout: u8,
    /// Client: also RDMA ATOMIC WRITE and FLUSH (IBA 1.5; kernel rxe
    /// has them from Linux 6.2).
    #[arg(long)]
    pub ext: bool,
}

impl StressArgs {
    /// The options [`crate::stress`] runs with.
    pub fn options(self) -> crate::stress::StressOptions {
        crate::stress::StressOptions {
            server: self.server,
            port: self.port,
            ib_dev: self.ib_dev,
            messages: self.messages,
            seed: self.seed,
            mtu: self.mtu,
            timeout: self.timeout,
            ext: self.ext,
        }
    }
}

/// ibv_rc_pingpong's options.
#[derive(clap::Args)]
pub struct RcPingPongArgs {
    /// The options every ping-pong tool takes.
    #[command(flatten)]
    pub common: PingPongArgs,
    /// Path MTU.
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// On-demand paging (not supported).
    #[arg(short = 'o', long)]
    pub odp: bool,
    /// Implicit on-demand paging (not supported).
    #[arg(short = 'O', long)]
    pub iodp: bool,
    /// Prefetch an ODP MR (not supported).
    #[arg(short = 'P', long)]
    pub prefetch: bool,
    /// Completion timestamps (not supported).
    #[arg(short = 't', long)]
    pub ts: bool,
    /// Device memory (not supported).
    #[arg(short = 'j', long)]
    pub dm: bool,
    /// New post-send API (not supported).
    #[arg(short = 'N', long = "new_send")]
    pub new_send: bool,
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// clap's own consistency checks of the whole definition (conflicting
    /// short flags, defaults a parser rejects, ...), which otherwise only
    /// fire when that subcommand is parsed.
    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
        let cmd = Cli::command();
        assert_eq!(cmd.get_name(), "uroce");
        assert!(cmd.get_subcommands().any(|s| s.get_name() == "rc-pingpong"));
    }
}
