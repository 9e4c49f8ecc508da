//! The settings and CLI reference in docs/reference/ are rendered from the clap definitions
//! (and the reference's variables from `sluice::settings::reference` and the reference's own
//! list in tests/fixtures/reference/settings.env), so they cannot drift: this test fails when
//! a committed page differs from what the code renders. Regenerate them with
//! `UPDATE_DOCS=1 cargo test --test it docs_reference`.

use std::collections::HashMap;
use std::fmt::Write as _;

use clap::CommandFactory;
use sluice::cli::Cli;
use sluice::settings::reference::{Support, VARIABLES};

const REFERENCE_ENV: &str = include_str!("../fixtures/reference/settings.env");

fn serve() -> clap::Command {
    Cli::command()
        .find_subcommand("serve")
        .expect("sluice has a serve command")
        .clone()
}

/// One line of table text: no newlines, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn flag(arg: &clap::Arg) -> String {
    let long = arg.get_long().unwrap_or_else(|| arg.get_id().as_str());
    let takes_value = arg.get_num_args().is_none_or(|n| n.takes_values())
        && !matches!(
            arg.get_action(),
            clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
        );
    match arg.get_value_names() {
        Some(names) if takes_value => format!("`--{long} <{}>`", names.join(" ")),
        _ if takes_value => format!("`--{long} <{}>`", arg.get_id().as_str().to_uppercase()),
        _ => format!("`--{long}`"),
    }
}

fn default_of(arg: &clap::Arg) -> String {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.is_empty() {
        String::new()
    } else {
        values.join(",")
    }
}

fn help_of(arg: &clap::Arg) -> String {
    let mut help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    // Booleans are switches whatever their possible values say.
    let boolean = matches!(arg.get_action(), clap::ArgAction::SetTrue)
        || (values.len() == 2 && values[0] == "`true`");
    if !values.is_empty() && !boolean {
        let _ = write!(help, " (one of {})", values.join(", "));
    }
    cell(&help)
}

/// docs/reference/settings.md: every `serve` flag, per help heading, then the reference's
/// variables with its defaults beside Sluice's.
fn settings_page() -> String {
    let serve = serve();
    let mut out = String::from(
        "# Settings reference\n\n\
         Generated from the code: every flag of `sluice serve`, with its environment variable,\n\
         default and help, as `sluice serve --help` prints them, then every environment\n\
         variable of envoyproxy/ratelimit with the reference's default beside Sluice's. Do not\n\
         edit by hand: `UPDATE_DOCS=1 cargo test --test it docs_reference` renders it again\n\
         (and the test fails when this page and the code differ).\n\n\
         A setting is read from its flag, else its environment variable, else the default; an\n\
         environment variable set to the empty string counts as not set.\n",
    );
    let mut headings: Vec<String> = Vec::new();
    let mut by_heading: HashMap<String, Vec<&clap::Arg>> = HashMap::new();
    for arg in serve.get_arguments().filter(|a| !a.is_hide_set()) {
        let heading = arg.get_help_heading().unwrap_or("General").to_owned();
        if !by_heading.contains_key(&heading) {
            headings.push(heading.clone());
        }
        by_heading.entry(heading).or_default().push(arg);
    }
    for heading in &headings {
        let _ = write!(
            out,
            "\n## {heading}\n\n| flag | environment | default | what |\n|---|---|---|---|\n"
        );
        for arg in &by_heading[heading] {
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let default = match default_of(arg) {
                d if d.is_empty() => String::new(),
                d => format!("`{d}`"),
            };
            let _ = writeln!(
                out,
                "| {} | {env} | {default} | {} |",
                flag(arg),
                help_of(arg)
            );
        }
    }
    out.push_str(&reference_variables(&serve));
    out
}

/// The reference's variables: its default, Sluice's, and what Sluice does with each.
fn reference_variables(serve: &clap::Command) -> String {
    let defaults: HashMap<&str, &str> = REFERENCE_ENV
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .collect();
    let by_env: HashMap<String, &clap::Arg> = serve
        .get_arguments()
        .filter_map(|a| Some((a.get_env()?.to_string_lossy().into_owned(), a)))
        .collect();
    let mut out = String::from(
        "\n## envoyproxy/ratelimit's variables\n\n\
         Every variable of the reference's `src/settings/settings.go`, with its default there\n\
         and Sluice's; **changed** marks a default that differs as written (a duration or size\n\
         may be the same value written otherwise: the text says). Variables set and not\n\
         supported are named at start-up in one warning line.\n\n\
         | variable | reference default | Sluice default | Sluice |\n|---|---|---|---|\n",
    );
    for (name, support) in VARIABLES {
        let theirs = defaults.get(name).copied().unwrap_or("");
        let (ours, what) = match support {
            Support::Read => match by_env.get(*name) {
                Some(arg) => (default_of(arg), format!("read: {}", flag(arg))),
                None => (
                    String::new(),
                    "read (see the text of the flag that names it)".into(),
                ),
            },
            Support::NotNeeded(why) => (String::new(), format!("not needed: {why}")),
            Support::Unsupported { .. } => (
                String::new(),
                "not supported (named at start-up when set)".into(),
            ),
        };
        let changed = matches!(support, Support::Read)
            && by_env.contains_key(*name)
            && !ours.eq_ignore_ascii_case(theirs);
        let show = |v: &str| {
            if v.is_empty() {
                "(empty)".to_owned()
            } else {
                format!("`{v}`")
            }
        };
        let ours_shown = if matches!(support, Support::Read) && by_env.contains_key(*name) {
            format!(
                "{}{}",
                show(&ours),
                if changed { " **changed**" } else { "" }
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "| `{name}` | {} | {ours_shown} | {} |",
            show(theirs),
            cell(&what)
        );
    }
    out
}

/// docs/reference/cli.md: every subcommand's `--help`.
fn cli_page() -> String {
    let mut out = String::from(
        "# CLI reference\n\n\
         Generated from the code: `sluice <command> --help` for every command. Do not edit by\n\
         hand: `UPDATE_DOCS=1 cargo test --test it docs_reference` renders it again.\n",
    );
    let mut cli = Cli::command();
    cli.build();
    for command in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        // Without the values the environment happens to hold (they would make the page
        // depend on where it is rendered).
        let mut command = command
            .clone()
            .bin_name(format!("sluice {}", command.get_name()))
            .mut_args(|a| a.hide_env_values(true));
        let help = command.render_long_help().to_string();
        let _ = write!(
            out,
            "\n## sluice {}\n\n```text\n{}\n```\n",
            command.get_name(),
            help.trim_end()
        );
    }
    out
}

pub(crate) fn check(relative: &str, rendered: &str) {
    let path = crate::common::repo_path(relative);
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "{relative} differs from what the code renders: run `UPDATE_DOCS=1 cargo test --test it docs_reference` and commit it"
    );
}

#[test]
fn the_settings_reference_is_what_the_code_says() {
    check("docs/reference/settings.md", &settings_page());
}

#[test]
fn the_cli_reference_is_what_the_code_says() {
    check("docs/reference/cli.md", &cli_page());
}

#[test]
fn every_serve_flag_is_in_the_settings_reference() {
    let page = settings_page();
    for arg in serve().get_arguments().filter(|a| !a.is_hide_set()) {
        let long = arg.get_long().unwrap_or_default();
        assert!(page.contains(&format!("`--{long}")), "--{long} is missing");
    }
}
