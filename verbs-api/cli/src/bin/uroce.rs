//! The `uroce` command: demo and tools around the uroce RoCEv2 stack.

use clap::{Parser, Subcommand};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use uroce_cli::pingpong::{Kind, PingPongOptions};

#[derive(Parser)]
#[command(
    name = "uroce",
    version,
    about = "Userspace RoCEv2: RDMA verbs without hardware or root"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
    Fuzz(Box<uroce_cli::fuzz::FuzzArgs>),
    /// rdma-core's rdma_server / rdma_client exchange through the
    /// connection manager (RDMA_PS_TCP, port 7471): the client sends 16
    /// bytes, the server answers with 16 (echoing them). Works against
    /// Debian's rdma_server / rdma_client.
    #[command(name = "cm-echo")]
    CmEcho {
        /// Server to connect to (none: be the server).
        server: Option<IpAddr>,
        /// Port.
        #[arg(short = 'p', long, default_value_t = uroce_cli::cm_echo::PORT)]
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
    /// devices, without root: `uroce exec -- ucx_info -d`.
    Exec {
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Every RC operation between two processes or hosts, every byte
    /// verified: run the server first, then the client with the server's
    /// address.
    #[command(name = "rc-stress")]
    RcStress {
        /// Server to connect to (no host: be the server).
        server: Option<String>,
        /// TCP port of the exchange.
        #[arg(short = 'p', long, default_value_t = 18516)]
        port: u16,
        /// Device (default: the first configured).
        #[arg(short = 'd', long = "ib-dev")]
        ib_dev: Option<String>,
        /// Messages to send (client).
        #[arg(short = 'n', long, default_value_t = 10000)]
        messages: u64,
        /// Seed of the operation mix (client).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Path MTU.
        #[arg(short = 'm', long, default_value_t = 1024)]
        mtu: u32,
        /// Local ACK timeout exponent (4.096 us x 2^t).
        #[arg(short = 't', long, default_value_t = 14)]
        timeout: u8,
        /// Client: also RDMA ATOMIC WRITE and FLUSH (IBA 1.5; kernel rxe
        /// has them from Linux 6.2).
        #[arg(long)]
        ext: bool,
    },
    /// rdma-core's ibv_rc_pingpong on uroce: same options, exchange and output.
    #[command(name = "rc-pingpong")]
    RcPingpong(RcPingPongArgs),
    /// rdma-core's ibv_uc_pingpong on uroce: same options, exchange and output.
    #[command(name = "uc-pingpong")]
    UcPingpong {
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
        #[command(flatten)]
        common: PingPongArgs,
    },
    /// rdma-core's ibv_srq_pingpong on uroce: same options, exchange and
    /// output (-q RC QPs sharing one SRQ).
    #[command(name = "srq-pingpong")]
    SrqPingpong {
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
struct PingPongArgs {
    /// Connect to the server at this host (no host: be the server).
    server: Option<String>,
    /// Listen on/connect to this TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Use this device (default: the first one).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Use this port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Size of the message to exchange (default 4096; UD 1024).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Service level.
    #[arg(short = 'l', long, default_value_t = 0)]
    sl: u8,
    /// Sleep while waiting for completions (default: poll).
    #[arg(short = 'e', long)]
    events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// Validate the received buffer.
    #[arg(short = 'c', long)]
    chk: bool,
}

/// ibv_rc_pingpong's options.
#[derive(clap::Args)]
struct RcPingPongArgs {
    #[command(flatten)]
    common: PingPongArgs,
    /// Path MTU.
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// On-demand paging (not supported).
    #[arg(short = 'o', long)]
    odp: bool,
    /// Implicit on-demand paging (not supported).
    #[arg(short = 'O', long)]
    iodp: bool,
    /// Prefetch an ODP MR (not supported).
    #[arg(short = 'P', long)]
    prefetch: bool,
    /// Completion timestamps (not supported).
    #[arg(short = 't', long)]
    ts: bool,
    /// Device memory (not supported).
    #[arg(short = 'j', long)]
    dm: bool,
    /// New post-send API (not supported).
    #[arg(short = 'N', long = "new_send")]
    new_send: bool,
}

fn rc_pingpong(a: RcPingPongArgs) -> ExitCode {
    for (set, what) in [
        (a.odp, "-o (on-demand paging)"),
        (a.iodp, "-O (implicit on-demand paging)"),
        (a.prefetch, "-P (ODP prefetch)"),
        (a.ts, "-t (completion timestamps)"),
        (a.dm, "-j (device memory)"),
        (a.new_send, "-N (new post send API)"),
    ] {
        if set {
            eprintln!("uroce rc-pingpong: {what} is not supported by uroce");
            return ExitCode::FAILURE;
        }
    }
    pingpong(Kind::Rc, a.common, |o| o.mtu = a.mtu)
}

/// Runs one ping-pong tool; `extra` sets the tool's own options.
fn pingpong(kind: Kind, a: PingPongArgs, extra: impl FnOnce(&mut PingPongOptions)) -> ExitCode {
    let mut o = PingPongOptions {
        server: a.server,
        port: a.port,
        ib_dev: a.ib_dev,
        ib_port: a.ib_port,
        size: a.size.unwrap_or(kind.default_size()),
        rx_depth: a.rx_depth,
        iters: a.iters,
        sl: a.sl,
        events: a.events,
        gid_idx: a.gid_idx,
        chk: a.chk,
        ..PingPongOptions::new(kind)
    };
    extra(&mut o);
    match uroce_cli::pingpong::run(&o) {
        Ok(r) if r.invalid_pages == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Demo {
            a,
            b,
            iters,
            mib,
            stats,
            pcap,
        } => {
            let opts = uroce_cli::demo::DemoOptions {
                addrs: (a, b),
                iters,
                bulk_bytes: mib << 20,
                pcap,
                ..Default::default()
            };
            println!("uroce demo: RC between uroce0 ({a}) and uroce1 ({b}) over UDP 4791");
            match uroce_cli::demo::run(&opts) {
                Ok(report) => {
                    print!("{}", uroce_cli::demo::format_table(&report.rows));
                    if stats {
                        print!("\n{}", uroce_cli::demo::format_counters(&report.counters));
                    }
                    if report.rows.iter().all(|r| r.verified) {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!("uroce demo: data verification FAILED");
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("uroce demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::RcPingpong(a) => rc_pingpong(a),
        Cmd::UcPingpong { common, mtu } => pingpong(Kind::Uc, common, |o| o.mtu = mtu),
        Cmd::UdPingpong { common } => pingpong(Kind::Ud, common, |_| {}),
        Cmd::SrqPingpong {
            common,
            mtu,
            num_qp,
            odp,
        } => {
            if odp {
                eprintln!("uroce srq-pingpong: -o (on-demand paging) is not supported by uroce");
                return ExitCode::FAILURE;
            }
            pingpong(Kind::Srq, common, |o| {
                o.mtu = mtu;
                o.num_qp = num_qp;
            })
        }
        Cmd::Decode { file } => uroce_cli::decode::run(&file),
        Cmd::TraceMerge { files, out } => match uroce_cli::trace_merge::run(&files, &out) {
            Ok(n) => {
                println!("{n} events from {} files in {}", files.len(), out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("uroce trace-merge: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Fuzz(a) => uroce_cli::fuzz::run(*a),
        Cmd::CmEcho {
            server,
            port,
            bind,
            verify,
        } => cm_echo(server, port, bind, verify),
        Cmd::SamplePcap { file, ipv4, ipv6 } => uroce_cli::sample::run(&file, ipv4, ipv6),
        Cmd::RcStress {
            server,
            port,
            ib_dev,
            messages,
            seed,
            mtu,
            timeout,
            ext,
        } => {
            let o = uroce_cli::stress::StressOptions {
                server,
                port,
                ib_dev,
                messages,
                seed,
                mtu,
                timeout,
                ext,
            };
            let start = std::time::Instant::now();
            let r = if o.server.is_some() {
                uroce_cli::stress::drive(&o)
            } else {
                uroce_cli::stress::serve(&o)
            };
            match r {
                Ok(r) => {
                    let ext = if r.ext_ops > 0 {
                        format!(", {} atomic writes and flushes", r.ext_ops)
                    } else {
                        String::new()
                    };
                    println!(
                        "rc-stress: {} sends, {} writes, {} reads, {} atomics{ext}, {} bytes in {:.2} s, {} errors",
                        r.sends,
                        r.writes,
                        r.reads,
                        r.atomics,
                        r.bytes,
                        start.elapsed().as_secs_f64(),
                        r.errors
                    );
                    if r.errors == 0 {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("uroce rc-stress: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Exec { cmd } => {
            let e = uroce_cli::libdir::exec(&cmd);
            eprintln!("uroce exec: {e}");
            ExitCode::FAILURE
        }
        Cmd::Stat { pid, json, watch } => {
            match uroce_cli::stat::run(uroce_cli::stat::StatOptions { pid, json, watch }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("uroce stat: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Libdir => match uroce_cli::libdir::run() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("uroce libdir: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Devices => match uroce_verbs::devices() {
            Ok(list) => {
                for d in list {
                    let gid = uroce_verbs::provider::qp_attr::gid_of(d.ip());
                    let hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();
                    println!(
                        "{:<10} {:<16} guid {:016x} gid[0] {hex} (RoCE v2)",
                        d.name(),
                        d.ip(),
                        d.guid()
                    );
                    // Opening binds the device's socket: its I/O path shows.
                    match d.open() {
                        Ok(ctx) => println!("{:<10} io: {}", "", ctx.io_path()),
                        Err(e) => println!("{:<10} io: unknown ({e})", ""),
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("uroce devices: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn cm_echo(server: Option<IpAddr>, port: u16, bind: Option<IpAddr>, verify: bool) -> ExitCode {
    use std::net::SocketAddr;
    use uroce_cli::cm_echo;
    let r = match server {
        None => {
            let ip = bind.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
            cm_echo::server(SocketAddr::new(ip, port)).map(|got| {
                println!("cm-echo server: received {:02x?}, echoed", got);
            })
        }
        Some(s) => {
            let src = bind.map(|ip| SocketAddr::new(ip, 0));
            cm_echo::client(src, SocketAddr::new(s, port)).and_then(|got| {
                println!(
                    "cm-echo client: sent {:02x?}, received {:02x?}",
                    cm_echo::CLIENT_MSG,
                    got
                );
                if verify && &got != cm_echo::CLIENT_MSG {
                    return Err(uroce_verbs::Error::Invalid("the echo differs".into()));
                }
                Ok(())
            })
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uroce cm-echo: {e}");
            ExitCode::FAILURE
        }
    }
}
