//! A config directory that would stall or empty the loader, against the real binary: symlink
//! loops are cut (each directory is read once), a FIFO named like a config file is refused by
//! name instead of blocking the loader forever, and a reload that finds no domain at all keeps
//! the policy in force and says why. Start-up fails with the reason instead of hanging.

use std::path::Path;
use std::time::Duration;

use crate::common::replace_file as write;
use crate::common::{DomainClient, SluiceProcess, config_dir, http_get};

const ONE: &str =
    "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
const FIVE: &str =
    "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

fn symlink(target: &str, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

/// Polls `/rlconfig` of `sluice` until it contains `needle` (failing with the page and the
/// log after 15 s).
async fn until_rlconfig(sluice: &SluiceProcess, needle: &str) -> String {
    let addr = sluice.http.parse().unwrap();
    let started = std::time::Instant::now();
    loop {
        let (_, page) = http_get(addr, "/rlconfig").await.unwrap();
        if page.contains(needle) {
            return page;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never: /rlconfig shows '{needle}'; it shows:\n{page}\nlog:\n{}",
            sluice.log.lock().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn args() -> Vec<&'static str> {
    vec!["--config-watch-interval", "100ms"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_loops_are_cut_and_reloads_still_work() {
    let dir = config_dir("hostile-loops", &[("h.yaml", ONE)]);
    // Three links back to the directory itself and one loop a level down: without cycle
    // detection a walk multiplies by three per level.
    for name in ["l1", "l2", "l3"] {
        symlink(".", &dir.join(name));
    }
    std::fs::create_dir(dir.join("sub")).unwrap();
    symlink("..", &dir.join("sub/up"));
    let sluice = SluiceProcess::spawn(&dir, &args());
    let client = DomainClient::connect(&sluice.grpc, "h");
    assert_eq!(client.hit("k=a").await.remaining(), vec![0]);
    write(&dir, "h.yaml", FIVE);
    until_rlconfig(&sluice, "requests_per_unit=5").await;
    let page = until_rlconfig(&sluice, "# last reload: ok").await;
    assert!(page.contains("h.yaml"), "{page}");
    assert_eq!(client.hit("k=b").await.remaining(), vec![4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_named_like_a_config_is_refused_and_later_changes_load() {
    let dir = config_dir("hostile-fifo", &[("h.yaml", ONE)]);
    let sluice = SluiceProcess::spawn(&dir, &args());
    let client = DomainClient::connect(&sluice.grpc, "h");
    crate::common::mkfifo(&dir.join("trap.yaml"));
    let page = until_rlconfig(&sluice, "rejected").await;
    assert!(
        page.contains("trap.yaml") && page.contains("not a regular file"),
        "{page}"
    );
    assert_eq!(
        client.hit("k=a").await.remaining(),
        vec![0],
        "the old policy serves"
    );
    // The FIFO goes, a change comes: it loads.
    std::fs::remove_file(dir.join("trap.yaml")).unwrap();
    write(&dir, "h.yaml", FIVE);
    until_rlconfig(&sluice, "requests_per_unit=5").await;
    assert_eq!(client.hit("k=b").await.remaining(), vec![4]);

    // At start-up the same FIFO is an error naming it, not a hang.
    crate::common::mkfifo(&dir.join("trap.yaml"));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    crate::common::eventually_blocking("start-up to refuse the FIFO", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.unwrap().success());
    assert!(
        stderr.contains("trap.yaml") && stderr.contains("not a regular file"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_finds_no_domain_keeps_the_policy_and_says_why() {
    let dir = config_dir("hostile-empty", &[("h.yaml", ONE)]);
    let sluice = SluiceProcess::spawn(&dir, &args());
    let client = DomainClient::connect(&sluice.grpc, "h");
    // The only file replaced by a directory (a mount gone wrong).
    std::fs::remove_file(dir.join("h.yaml")).unwrap();
    std::fs::create_dir(dir.join("h.yaml")).unwrap();
    let page = until_rlconfig(&sluice, "rejected").await;
    assert!(page.contains("no domain found"), "{page}");
    assert_eq!(
        client.hit("k=a").await.remaining(),
        vec![0],
        "the limits stay on"
    );
    // Put back, it loads again.
    std::fs::remove_dir(dir.join("h.yaml")).unwrap();
    write(&dir, "h.yaml", FIVE);
    until_rlconfig(&sluice, "requests_per_unit=5").await;
}
