//! The generated documentation, and the test that keeps the committed
//! copies current:
//!
//! * `docs/man/uroce.1` and `docs/man/uroce-SUB.1` for every subcommand,
//!   from the command's own definitions ([`crate::args::Cli`], by
//!   clap_mangen);
//! * `docs/man/uroce.7`, the environment variables, and the book's
//!   `docs/src/reference/environment.md`, both from the provider's table
//!   ([`uroce_provider::env::VARS`]);
//! * the book's `docs/src/reference/man.md`, an index of the pages.
//!
//! `cargo test -p uroce-cli --lib docgen` fails when a committed copy
//! differs from what the definitions make now; with `UROCE_BLESS=1` it
//! writes them instead.

use crate::args::Cli;
use clap::CommandFactory;
use roff::{bold, roman, Roff};
use std::path::{Path, PathBuf};
use uroce_provider::env::{Scope, VARS};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("verbs-api/cli sits two levels below the root")
        .to_path_buf()
}

/// The command as its man pages see it: built, so every subcommand knows
/// its full name (`uroce-demo`), without clap's own `help` subcommand.
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The command and every visible subcommand, depth first: one section 1
/// page each, the command's first.
fn pages() -> Vec<clap::Command> {
    fn walk(cmd: &clap::Command, out: &mut Vec<clap::Command>) {
        out.push(cmd.clone());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, out);
        }
    }
    let mut out = Vec::new();
    walk(&command(), &mut out);
    out
}

/// A page's name as `man` cites it (`uroce-demo(1)`).
fn page_name(cmd: &clap::Command) -> String {
    format!("{}(1)", cmd.get_display_name().unwrap_or(cmd.get_name()))
}

/// Every page of section 1: (file name, roff), the command's first.
fn section1() -> Vec<(String, String)> {
    pages()
        .into_iter()
        .map(|cmd| {
            let man = clap_mangen::Man::new(cmd).manual("uroce manual");
            let mut page = Vec::new();
            man.render(&mut page).expect("render to memory");
            let page = String::from_utf8(page).expect("roff is UTF-8");
            (man.get_filename(), page)
        })
        .collect()
}

/// `uroce(7)`: what uroce is for a reader of `man`, and every variable.
fn section7() -> String {
    let mut r = Roff::new();
    r.control("TH", ["uroce", "7", "", "uroce", "uroce manual"]);
    r.control("SH", ["NAME"]);
    r.text([roman(
        "uroce - the environment of programs on uroce's RDMA devices",
    )]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman(
        "uroce is a userspace RoCEv2 provider: a verbs library (Rust, and drop-in \
         libibverbs.so.1 and librdmacm.so.1 for C programs) whose engine speaks RoCEv2 over \
         UDP port 4791 on loopback or any local address. These variables steer it; they are \
         read when a device opens unless said otherwise.",
    )]);
    for scope in Scope::ALL {
        r.control("SH", [scope.title().to_uppercase().as_str()]);
        for v in VARS.iter().filter(|v| v.scope == scope) {
            r.control("TP", []);
            r.text([bold(v.name)]);
            // Markdown's code quotes mean nothing to roff.
            let text = format!("{} Default: {}.", v.meaning, v.default).replace('`', "");
            r.text([roman(text)]);
        }
    }
    r.control("SH", ["SEE ALSO"]);
    let pages: Vec<String> = pages().iter().map(page_name).collect();
    r.text([roman(pages.join(", ") + ", ibv_devices(1), rdma_cm(7)")]);
    r.render()
}

/// A cell of a markdown table: no `|` breaks it, no newline ends it.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The book's page of variables.
fn environment_md() -> String {
    let mut s = String::from(
        "# Environment variables\n\n\
         <!-- Generated from provider/src/env.rs by verbs-api/cli/src/docgen.rs: \
         edit the table there and run `UROCE_BLESS=1 cargo test -p uroce-cli --lib docgen`. -->\n\n\
         Every `UROCE_*` variable the project reads. The first two groups concern a \
         program that uses uroce; the others steer uroce's own tests, benchmarks, fuzzers \
         and interop matrix. The same list is the `uroce(7)` man page \
         ([Man pages](man.md)); a test fails when code reads a variable this table lacks.\n",
    );
    for scope in Scope::ALL {
        s += &format!(
            "\n## {}\n\n| variable | default | meaning |\n|---|---|---|\n",
            scope.title()
        );
        for v in VARS.iter().filter(|v| v.scope == scope) {
            s += &format!(
                "| `{}` | {} | {} |\n",
                v.name,
                cell(v.default),
                cell(v.meaning)
            );
        }
    }
    s
}

/// The book's index of the man pages.
fn man_md() -> String {
    let mut s = String::from(
        "# Man pages\n\n\
         <!-- Generated by verbs-api/cli/src/docgen.rs from the command's definitions: run \
         `UROCE_BLESS=1 cargo test -p uroce-cli --lib docgen` after changing them. -->\n\n\
         The `uroce` command's pages are generated from its own definitions (clap_mangen) \
         and kept in `docs/man/`; read one with `man docs/man/uroce.1`, or install them \
         with `cp docs/man/*.1 /usr/local/share/man/man1/` and `cp docs/man/uroce.7 /usr/local/share/man/man7/`.\n\n\
         | page | what it is |\n|---|---|\n",
    );
    for cmd in pages() {
        let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
        let about = cell(about.lines().next().unwrap_or(""));
        s += &format!("| `{}` | {about} |\n", page_name(&cmd));
    }
    s +=
        "| `uroce(7)` | the environment variables: see [Environment variables](environment.md) |\n";
    s
}

/// Every generated file: (path from the root, content).
fn generated() -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> = section1()
        .into_iter()
        .map(|(f, page)| (PathBuf::from("docs/man").join(f), page))
        .collect();
    out.push(("docs/man/uroce.7".into(), section7()));
    out.push(("docs/src/reference/environment.md".into(), environment_md()));
    out.push(("docs/src/reference/man.md".into(), man_md()));
    out
}

#[test]
fn generated_docs_are_current() {
    let root = root();
    let bless = std::env::var_os("UROCE_BLESS").is_some_and(|v| v == "1");
    let files = generated();
    let mut stale = Vec::new();
    for (rel, content) in &files {
        let path = root.join(rel);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(content.as_str()) {
            continue;
        }
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, content).unwrap();
        } else {
            stale.push(rel.display().to_string());
        }
    }
    // Pages of subcommands that no longer exist.
    let known: Vec<&PathBuf> = files.iter().map(|(p, _)| p).collect();
    if let Ok(dir) = std::fs::read_dir(root.join("docs/man")) {
        for e in dir.flatten() {
            let rel = PathBuf::from("docs/man").join(e.file_name());
            if !known.contains(&&rel) {
                if bless {
                    std::fs::remove_file(e.path()).unwrap();
                } else {
                    stale.push(format!("{} (no such page any more)", rel.display()));
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "generated docs out of date: {stale:?}; run `UROCE_BLESS=1 cargo test -p uroce-cli --lib docgen`"
    );
}

#[test]
fn every_subcommand_has_a_page_and_every_variable_a_line() {
    let pages = section1();
    let names: Vec<&str> = pages.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(names[0], "uroce.1");
    for sub in [
        "uroce-demo.1",
        "uroce-stat.1",
        "uroce-fuzz.1",
        "uroce-exec.1",
    ] {
        assert!(names.contains(&sub), "{sub} missing from {names:?}");
    }
    let seven = section7();
    let md = environment_md();
    for v in VARS {
        assert!(seven.contains(v.name) && md.contains(v.name), "{}", v.name);
    }
}
