//! The `uroce` command: demo and tools around the uroce RoCEv2 stack.
//!
//! The command line is [`uroce_cli::args`]; this file parses it and hands
//! each subcommand to its module, turning the outcome into the exit code.

use clap::Parser;
use std::fmt::Display;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use uroce_cli::args::{Cli, Cmd, PingPongArgs, RcPingPongArgs};
use uroce_cli::pingpong::{Kind, PingPongOptions};

fn main() -> ExitCode {
    match Cli::parse().cmd {
        Cmd::Demo {
            a,
            b,
            iters,
            mib,
            stats,
            pcap,
        } => demo((a, b), iters, mib, stats, pcap),
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
        Cmd::TraceMerge { files, out } => outcome(
            "trace-merge",
            uroce_cli::trace_merge::run(&files, &out).map(|n| {
                println!("{n} events from {} files in {}", files.len(), out.display());
            }),
        ),
        Cmd::Fuzz(a) => uroce_cli::fuzz::run(*a),
        Cmd::CmEcho {
            server,
            port,
            bind,
            verify,
        } => cm_echo(server, port, bind, verify),
        Cmd::SamplePcap { file, ipv4, ipv6 } => uroce_cli::sample::run(&file, ipv4, ipv6),
        Cmd::RcStress(a) => rc_stress(a.options()),
        Cmd::Exec { cmd } => {
            let e = uroce_cli::libdir::exec(&cmd);
            eprintln!("uroce exec: {e}");
            ExitCode::FAILURE
        }
        Cmd::Stat { pid, json, watch } => outcome(
            "stat",
            uroce_cli::stat::run(uroce_cli::stat::StatOptions { pid, json, watch }),
        ),
        Cmd::Libdir => outcome("libdir", uroce_cli::libdir::run()),
        Cmd::Devices => outcome("devices", devices()),
    }
}

/// The exit code of subcommand `sub`'s outcome; an error is printed as
/// `uroce SUB: error`.
fn outcome(sub: &str, r: Result<(), impl Display>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uroce {sub}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `uroce demo`: the table (and with `stats` the counters); fails unless
/// every row's data was verified.
fn demo(
    addrs: (IpAddr, IpAddr),
    iters: u32,
    mib: usize,
    stats: bool,
    pcap: Option<PathBuf>,
) -> ExitCode {
    let opts = uroce_cli::demo::DemoOptions {
        addrs,
        iters,
        bulk_bytes: mib << 20,
        pcap,
        ..Default::default()
    };
    let (a, b) = addrs;
    println!("uroce demo: RC between uroce0 ({a}) and uroce1 ({b}) over UDP 4791");
    let report = match uroce_cli::demo::run(&opts) {
        Ok(report) => report,
        Err(e) => return outcome("demo", Err(e)),
    };
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

/// `uroce rc-stress`: the server or the client, then the summary line;
/// fails on any verification error.
fn rc_stress(o: uroce_cli::stress::StressOptions) -> ExitCode {
    let start = std::time::Instant::now();
    let r = if o.server.is_some() {
        uroce_cli::stress::drive(&o)
    } else {
        uroce_cli::stress::serve(&o)
    };
    let r = match r {
        Ok(r) => r,
        Err(e) => return outcome("rc-stress", Err(e)),
    };
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

/// `uroce devices`: each configured device, its GID and I/O path.
fn devices() -> uroce_verbs::Result<()> {
    for d in uroce_verbs::devices()? {
        let gid = uroce_provider::qp_attr::gid_of(d.ip());
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
    Ok(())
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
    outcome("cm-echo", r)
}
