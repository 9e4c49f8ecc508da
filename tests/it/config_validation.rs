// Why one long file: one fixture per validation rule, and the table of expected messages.
//! Config validation, one fixture per rule (`tests/fixtures/config/invalid/*.yaml`): each
//! error names its file, its tree path, the parser's line:column when there is one, and uses
//! the reference service's wording. Also the directory loader (what it skips, duplicate
//! domains) and the `sluice validate` command.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice::config::{self, ConfigError, LoadOptions};
use sluice::policy::{RuleLimit, Unit};

fn fixtures() -> PathBuf {
    crate::common::repo_path("tests/fixtures/config")
}

fn invalid(name: &str) -> PathBuf {
    fixtures().join("invalid").join(name)
}

/// Loads in-memory `(file name, YAML)` sources and returns their errors.
fn errors_of_text(sources: &[(&str, &str)], options: LoadOptions) -> Vec<ConfigError> {
    let sources: Vec<(String, String)> = sources
        .iter()
        .map(|(name, text)| (name.to_string(), text.to_string()))
        .collect();
    config::load_sources(&sources, options).expect_err("should be rejected")
}

/// Loads one invalid fixture through `load_sources` and returns its errors.
fn errors_of(name: &str) -> Vec<ConfigError> {
    let text = std::fs::read_to_string(invalid(name)).unwrap();
    errors_of_text(&[(name, &text)], LoadOptions::default())
}

const MERGE: LoadOptions = LoadOptions {
    merge_domains: true,
};

/// A directory under the system temp dir, removed on drop. Unique per process and call, so
/// tests can run in parallel (and alongside other test binaries).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "sluice-config-validation-{}-{n}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// A temp dir holding copies of the named invalid fixtures.
    fn with_invalid(tag: &str, names: &[&str]) -> Self {
        let dir = Self::new(tag);
        for name in names {
            std::fs::copy(invalid(name), dir.0.join(name)).unwrap();
        }
        dir
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// === one fixture per rule ===

/// The one error each fixture yields, as displayed: `file[:line:column]: [path: ]message`,
/// where the line:column is the YAML parser's. A prefix where the parser's own text follows.
/// `several_unknown_keys.yaml` has its own test below.
const ONE_ERROR_PER_FIXTURE: &[&str] = &[
    "misspelled_key.yaml:4:5: descriptors[0]: config error, unknown key 'ratelimit'",
    "misspelled_key_nested.yaml:6:7: descriptors[0].rate_limit: config error, unknown key 'requestsperunit'",
    "empty_domain.yaml: config file cannot have empty domain",
    "missing_domain.yaml: config file cannot have empty domain",
    "empty_key.yaml:7:5: descriptors[1].key: descriptor has empty key",
    "duplicate_key.yaml:8:5: descriptors[1]: duplicate descriptor composite key 'duplicate-key.key1_value1'",
    "bad_unit.yaml:5:7: descriptors[0].rate_limit.unit: invalid rate limit unit 'foo'",
    "missing_unit.yaml:4:5: descriptors[0].rate_limit.unit: invalid rate limit unit ''",
    "missing_requests_per_unit.yaml:4:5: descriptors[0].rate_limit: rate limit has no requests_per_unit",
    "unlimited_with_unit.yaml:6:7: descriptors[0].rate_limit.unit: should not specify rate limit unit when unlimited",
    "unlimited_with_algorithm.yaml:6:7: descriptors[0].rate_limit.algorithm: should not specify an algorithm when unlimited",
    "unlimited_with_burst.yaml:6:7: descriptors[0].rate_limit.burst: should not specify burst when unlimited",
    "non_string_key.yaml:3:10: descriptors[0].key: invalid type: sequence, expected a string",
    "priorities_empty.yaml:4:5: descriptors[0].priorities: priorities must name at least one class",
    "priorities_unlimited.yaml:4:5: descriptors[0].priorities: priorities need a counted limit, not unlimited",
    "replaces_empty.yaml:9:11: descriptors[0].rate_limit.replaces[0]: should not have an empty replaces entry",
    "replaces_self.yaml:9:11: descriptors[0].rate_limit.replaces[0]: replaces should not contain name of same descriptor",
    "share_threshold_without_wildcard.yaml:5:5: descriptors[0].share_threshold: share_threshold can only be used with wildcard values (containing '*'), but found key 'path_files'",
    "bad_yaml.yaml:5:1: error loading config file: did not find expected ',' or '}'",
    "wrong_type.yaml:6:26: descriptors[0].rate_limit.requests_per_unit: invalid type: string \"many\"",
    "wrong_type_list.yaml:5:7: descriptors[0].rate_limit: invalid type: sequence",
    "negative_requests.yaml:6:26: descriptors[0].rate_limit.requests_per_unit: invalid type: integer `-1`",
    "non_map_list.yaml:2:15: descriptors[0]: config error, yaml file contains list of type other than map: a",
    "metadata_not_a_map.yaml:4:5: descriptors[0].metadata: error parsing metadata",
    "burst_without_token_bucket.yaml:4:54: descriptors[0].rate_limit.burst: burst is only valid with algorithm: token_bucket",
    "zero_burst.yaml:4:79: descriptors[0].rate_limit.burst: burst must be at least 1",
    "bad_algorithm.yaml:4:54: descriptors[0].rate_limit.algorithm: invalid algorithm 'leaky_bucket' (expected fixed_window, sliding_window, token_bucket or concurrency)",
    "rate_limit_and_rate_limits.yaml:5:5: descriptors[0].rate_limits: rate_limit and rate_limits are mutually exclusive",
    "empty_rate_limits.yaml:4:5: descriptors[0].rate_limits: rate_limits must not be empty",
    "unlimited_in_rate_limits.yaml:6:10: descriptors[0].rate_limits[1].unlimited: unlimited is not allowed in rate_limits",
    "duplicate_limits.yaml:6:9: descriptors[0].rate_limits[1]: two rate_limits with unit SECOND and algorithm fixed_window",
    "negative_burst.yaml:4:86: descriptors[0].rate_limit.burst: invalid type: integer `-3`, expected a whole number from 0 to 9007199254740991",
    "limit_past_two_to_the_53.yaml:4:31: descriptors[0].rate_limit.requests_per_unit: requests_per_unit 9007199254740992 is over the largest limit, 9007199254740991 (2^53 - 1)",
    "priorities_out_of_range.yaml:4:33: descriptors[0].priorities.low: priority share 1.5 is not in (0, 1]",
    "priorities_with_value.yaml:5:5: descriptors[0].priorities: priorities need a key-only descriptor",
    "priorities_without_limit.yaml:4:5: descriptors[0].priorities: priorities without rate_limit or rate_limits",
    "bad_failure_mode.yaml:4:5: descriptors[0].failure_mode: invalid failure_mode 'open' (expected allow, deny, local or envoy)",
    "too_deep.yaml:5:73: nesting deeper than 64 levels",
    "overdraft_with_concurrency.yaml:4:78: descriptors[0].rate_limit.overdraft: overdraft is not valid with algorithm: concurrency",
    "unlimited_with_overdraft.yaml:6:7: descriptors[0].rate_limit.overdraft: should not specify overdraft when unlimited",
    "leased_overdraft.yaml:4:5: descriptors[0].consistency: consistency: leased is not available with overdraft",
    "bad_scope.yaml:4:5: descriptors[0].scope: invalid scope 'everywhere' (expected region or global)",
    "global_slow_token_bucket.yaml:4:5: descriptors[0].scope: scope: global is not available with a token bucket refilling slower than a token every 11 days",
    "global_concurrency.yaml:4:5: descriptors[0].scope: scope: global is not available with algorithm concurrency",
    "global_exact.yaml:5:5: descriptors[0].scope: scope: global needs consistency: leased",
    "zero_unit_multiplier.yaml:6:32: descriptors[1].rate_limit.unit_multiplier: unit_multiplier must be at least 1",
    "negative_unit_multiplier.yaml:4:49: descriptors[0].rate_limit.unit_multiplier: invalid type: integer `-5`",
    "overflowing_unit_multiplier.yaml:6:22: descriptors[0].rate_limits[1].unit_multiplier: a window of 101 x YEAR is longer than 100 years",
    "unlimited_with_unit_multiplier.yaml:4:35: descriptors[0].rate_limit.unit_multiplier: should not specify unit_multiplier when unlimited",
];

/// The fixture an expected line is about.
fn fixture_of(expected: &str) -> &str {
    expected.split(':').next().unwrap()
}

#[test]
fn each_invalid_fixture_reports_its_rule_with_file_path_and_location() {
    for expected in ONE_ERROR_PER_FIXTURE {
        let name = fixture_of(expected);
        let errors = errors_of(name);
        assert_eq!(errors.len(), 1, "{name}: {errors:#?}");
        assert_eq!(errors[0].file, name);
        let shown = errors[0].to_string();
        assert!(
            shown.starts_with(expected),
            "\n got: {shown}\nwant: {expected}"
        );
    }
}

#[test]
fn location_and_tree_path_are_kept_apart_from_the_message() {
    let error = &errors_of("bad_unit.yaml")[0];
    assert_eq!(error.location, Some((5, 7)));
    assert_eq!(error.path, "descriptors[0].rate_limit.unit");
    assert_eq!(error.message, "invalid rate limit unit 'foo'");
    let error = &errors_of("misspelled_key_nested.yaml")[0];
    assert_eq!(error.location, Some((6, 7)));
    assert_eq!(error.path, "descriptors[0].rate_limit");
    assert_eq!(error.message, "config error, unknown key 'requestsperunit'");
    let error = &errors_of("bad_yaml.yaml")[0];
    assert_eq!((error.location, error.path.as_str()), (Some((5, 1)), ""));
}

/// Every file in `invalid/`, sorted.
fn invalid_fixtures() -> Vec<String> {
    let dir = std::fs::read_dir(fixtures().join("invalid")).unwrap();
    let mut names: Vec<String> = dir
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn every_invalid_fixture_is_covered_by_a_test() {
    let mut covered: Vec<String> = ONE_ERROR_PER_FIXTURE
        .iter()
        .map(|expected| fixture_of(expected).to_owned())
        .chain(["several_unknown_keys.yaml", "errors_at_their_fields.yaml"].map(String::from))
        .collect();
    covered.sort();
    assert_eq!(invalid_fixtures(), covered);
}

/// Every error found after parsing is shown at the line and column of the field that is
/// wrong (its key), however deep, in block or flow style; not at its descriptor's.
#[test]
fn each_error_is_at_the_line_of_its_field() {
    let name = "errors_at_their_fields.yaml";
    let text = std::fs::read_to_string(invalid(name)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let errors = errors_of(name);
    let found: Vec<(Option<(usize, usize)>, &str)> = errors
        .iter()
        .map(|e| (e.location, e.path.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (Some((7, 7)), "descriptors[0].rate_limit.unit_multiplier"),
            (Some((10, 18)), "descriptors[1].rate_limit.unit"),
            (
                Some((19, 9)),
                "descriptors[2].descriptors[0].share_threshold"
            ),
            (
                Some((18, 11)),
                "descriptors[2].descriptors[0].rate_limit.burst"
            ),
            (
                Some((23, 11)),
                "descriptors[2].descriptors[1].rate_limit.unit"
            ),
            (
                Some((29, 13)),
                "descriptors[2].descriptors[2].rate_limits[1].unit_multiplier"
            ),
        ],
        "{errors:#?}"
    );
    for error in &errors {
        let (line, column) = error.location.unwrap();
        let field = error.path.rsplit('.').next().unwrap();
        assert!(
            lines[line - 1][column - 1..].starts_with(field),
            "{error}: line {line} is `{}`",
            lines[line - 1]
        );
    }
}

#[test]
fn several_unknown_keys_are_all_reported_in_document_order() {
    let shown: Vec<String> = errors_of("several_unknown_keys.yaml")
        .iter()
        .map(ToString::to_string)
        .collect();
    // The parser stops at the first one; the others are found in the text, each at its key.
    assert_eq!(
        shown,
        [
            "several_unknown_keys.yaml:2:1: config error, unknown key 'domian'",
            "several_unknown_keys.yaml:5:5: descriptors[0]: config error, unknown key 'shadowmode'",
            "several_unknown_keys.yaml:12:11: descriptors[0].descriptors[0].rate_limit: config error, unknown key 'unti'",
        ]
    );
}

#[test]
fn an_empty_file_has_an_empty_domain() {
    let errors = errors_of_text(&[("empty.yaml", "")], LoadOptions::default());
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["empty.yaml: config file cannot have empty domain"]);
}

#[test]
fn errors_of_every_file_and_every_rule_are_collected() {
    let names = ["bad_unit.yaml", "empty_key.yaml", "replaces_self.yaml"];
    let sources: Vec<(String, String)> = names
        .iter()
        .map(|n| (n.to_string(), std::fs::read_to_string(invalid(n)).unwrap()))
        .collect();
    let errors = config::load_sources(&sources, LoadOptions::default()).unwrap_err();
    let files: Vec<&str> = errors.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(files, names);

    let one_file = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: foo, requests_per_unit: 1}\n  - key: ''\n  - key: b\n    value: v\n    share_threshold: true\n";
    let errors = errors_of_text(&[("x.yaml", one_file)], LoadOptions::default());
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "descriptors[0].rate_limit.unit",
            "descriptors[1].key",
            "descriptors[2].share_threshold"
        ]
    );
}

#[test]
fn rate_limit_with_several_errors_reports_all_of_them() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: foo\n      requests_per_unit: 1\n      name: n\n      replaces: [{name: n}]\n";
    let errors = errors_of_text(&[("x.yaml", yaml)], LoadOptions::default());
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "invalid rate limit unit 'foo'",
            "replaces should not contain name of same descriptor"
        ]
    );
}

#[test]
fn type_errors_are_reported_like_the_other_rules() {
    let error = &errors_of("wrong_type.yaml")[0];
    assert_eq!(error.path, "descriptors[0].rate_limit.requests_per_unit");
    assert!(error.message.starts_with("invalid type"), "{error:?}");
    for name in ["non_map_list.yaml", "wrong_type_list.yaml"] {
        let error = &errors_of(name)[0];
        assert!(!error.message.contains("Raw"), "{error}");
    }
}

#[test]
fn loading_the_whole_invalid_directory_reports_each_files_errors() {
    // load_dir reports what load_sources does for each file. Each fixture has its own
    // domain, so together they add no duplicate-domain error.
    let mut all = config::load_dir(&fixtures().join("invalid"), LoadOptions::default())
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>();
    let mut each: Vec<String> = invalid_fixtures()
        .iter()
        .flat_map(|name| errors_of(name))
        .map(|e| e.to_string())
        .collect();
    all.sort();
    each.sort();
    assert_eq!(all, each);
}

// === the directory loader ===

#[test]
fn valid_directory_loads_and_skips_dotfiles_dot_directories_and_other_extensions() {
    let loaded = config::load_dir(&fixtures().join("valid"), LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e:#?}"));
    let files = loaded.files.join(" ");
    assert_eq!(files, "basic.yaml features.yaml nested/more.yaml units.yml");
    let policy = &loaded.policy;
    assert_eq!(policy.domain_count(), 4);
    for domain in ["test-domain", "features", "nested", "units"] {
        assert!(policy.domain(domain).is_some(), "{domain}");
    }
}

#[test]
fn valid_fixtures_keep_every_field() {
    let policy = config::load_dir(&fixtures().join("valid"), LoadOptions::default())
        .unwrap()
        .policy;
    let features = policy.domain("features").unwrap();
    let rule = |entries: &[(&str, &str)]| features.find(entries).unwrap().clone();

    let acme = rule(&[("tenant", "acme")]);
    assert!(acme.quota_mode && !acme.shadow_mode);
    assert_eq!(acme.name.as_deref(), Some("acme_daily"));
    assert_eq!(acme.replaces, ["tenant_default"]);
    let other = rule(&[("tenant", "other")]);
    assert!(other.shadow_mode && other.value_to_metric && !other.quota_mode);
    assert_eq!(rule(&[("tenant", "internal")]).limit, RuleLimit::Unlimited);
    assert_eq!(
        rule(&[("path", "/files/a")]).shared,
        [Some("/files/*".to_owned())]
    );
    assert!(rule(&[("path", "/api/v1/users")]).detailed_metric);
    assert_eq!(
        rule(&[("path", "/v2/orders/7/items")]).stats_key,
        "features.path_/v*/orders/*/items*"
    );
    let nested = rule(&[("client", "c"), ("method", "GET"), ("route", "/x")]);
    assert_eq!(nested.stats_key, "features.client.method_GET.route_*");

    let units = policy.domain("units").unwrap();
    for (value, unit) in ["second", "minute", "hour", "day", "week", "month", "year"]
        .into_iter()
        .zip(Unit::ALL)
    {
        match &units.find(&[("u", value)]).unwrap().limit {
            RuleLimit::Limited(limits) => assert_eq!(limits[0].unit, unit, "{value}"),
            RuleLimit::Unlimited => panic!("{value} is limited"),
        }
    }
}

#[test]
fn duplicate_domain_across_files_names_both_files() {
    let errors =
        config::load_dir(&fixtures().join("duplicate_domain"), LoadOptions::default()).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let error = errors[0].to_string();
    assert!(
        error.starts_with("duplicate_domain_b.yaml:1:1: "),
        "{error}"
    );
    assert!(
        error.contains("duplicate domain 'shared-domain'"),
        "{error}"
    );
    assert!(error.contains("duplicate_domain_a.yaml"), "{error}");
}

#[test]
fn merge_domains_combines_files_of_one_domain() {
    let loaded = config::load_dir(&fixtures().join("duplicate_domain"), MERGE).unwrap();
    let domain = loaded.policy.domain("shared-domain").unwrap();
    for entry in [("key1", "value1"), ("key2", "value2")] {
        assert!(domain.find(&[entry]).is_some(), "{entry:?}");
    }
}

#[test]
fn merge_domains_still_rejects_a_duplicate_composite_key() {
    let text = std::fs::read_to_string(fixtures().join("duplicate_domain/duplicate_domain_a.yaml"))
        .unwrap();
    let errors = errors_of_text(&[("a.yaml", &text), ("b.yaml", &text)], MERGE);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, "b.yaml");
    assert!(
        errors[0]
            .message
            .contains("duplicate descriptor composite key 'shared-domain.key1_value1'")
    );
}

#[cfg(unix)]
#[test]
fn configmap_symlink_layout_loads_each_file_once() {
    use std::os::unix::fs::symlink;
    // Kubernetes mounts: real files in `..<timestamp>/`, `..data` links to it, and each
    // top-level name links into `..data`.
    let dir = TempDir::new("configmap");
    let real = dir.0.join("..2026_01_01_00_00_00.000000000");
    std::fs::create_dir(&real).unwrap();
    std::fs::copy(fixtures().join("valid/basic.yaml"), real.join("basic.yaml")).unwrap();
    symlink(&real, dir.0.join("..data")).unwrap();
    symlink("..data/basic.yaml", dir.0.join("basic.yaml")).unwrap();
    symlink("..data/gone.yaml", dir.0.join("gone.yaml")).unwrap(); // dangling mid-swap
    let loaded = config::load_dir(&dir.0, LoadOptions::default()).unwrap();
    assert_eq!(loaded.files, ["basic.yaml"]);
    assert!(loaded.policy.domain("test-domain").is_some());
}

// === bounds checked before parsing ===

/// Writes `len` bytes of valid YAML (a domain, then comment lines) to `dir/name`.
fn write_yaml_of_len(dir: &Path, name: &str, len: u64) {
    let mut text = format!("domain: {}\n", name.trim_end_matches(".yaml"));
    let line = format!("# {}\n", "x".repeat(97));
    while (text.len() + line.len()) as u64 <= len {
        text.push_str(&line);
    }
    text.push_str(&"#".repeat(len as usize - text.len()));
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn a_file_over_the_size_bound_is_refused_with_its_size() {
    let dir = TempDir::new("too-big");
    write_yaml_of_len(&dir.0, "fits.yaml", config::MAX_FILE_BYTES);
    write_yaml_of_len(&dir.0, "big.yaml", config::MAX_FILE_BYTES + 1);
    let errors = config::load_dir(&dir.0, LoadOptions::default()).unwrap_err();
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        ["big.yaml: file is 4194305 bytes, more than the 4194304 a config file may have"]
    );
}

#[test]
fn a_directory_over_the_total_bound_is_refused_as_a_whole() {
    let dir = TempDir::new("too-big-total");
    let each = config::MAX_DIR_BYTES / 5 + 1; // five files that fit alone but not together
    for n in 0..5 {
        write_yaml_of_len(&dir.0, &format!("part{n}.yaml"), each);
    }
    let errors = config::load_dir(&dir.0, LoadOptions::default()).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(
        errors[0].to_string(),
        format!(
            "{}: config files add up to more than the 16777216 bytes a config directory may have",
            dir.0.display()
        )
    );
}

#[test]
fn a_deep_file_is_refused_at_the_level_past_the_bound() {
    // The file of the report: 1 MB nested 40,000 deep, which kept the parser busy for over
    // a minute. Refused at the 65th level, before parsing.
    let deep = format!("domain: d\ndescriptors: {}", "[".repeat(40_000));
    let errors = errors_of_text(&[("deep.yaml", &deep)], LoadOptions::default());
    let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["deep.yaml:2:77: nesting deeper than 64 levels"]);
    // Brackets that are text do not count.
    let text = format!(
        "domain: d\ndescriptors:\n  - key: k # {}\n    value: '{}'\n",
        "[".repeat(100),
        "{".repeat(100)
    );
    let sources = [("d.yaml".to_owned(), text)];
    config::load_sources(&sources, LoadOptions::default()).unwrap();
}

// === `sluice validate DIR` ===

/// Runs `sluice validate ARGS...`, ignoring any MERGE_DOMAIN_CONFIG of the environment.
fn validate(args: &[&dyn AsRef<OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("validate")
        .args(args.iter().map(|a| a.as_ref()))
        .env_remove("MERGE_DOMAIN_CONFIG")
        .output()
        .unwrap()
}

/// Asserts that `out` exited with `code`, showing its stderr otherwise.
fn assert_exit(out: &Output, code: i32) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
}

#[test]
fn validate_command_accepts_the_valid_directory() {
    let out = validate(&[&fixtures().join("valid")]);
    assert_exit(&out, 0);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "all rate limit configs ok"
    );
}

#[test]
fn validate_command_merges_domains_when_asked() {
    let dir = fixtures().join("duplicate_domain");
    assert_eq!(validate(&[&dir]).status.code(), Some(1));
    assert_exit(&validate(&[&dir, &"--merge-domain-config"]), 0);
}

#[test]
fn validate_merge_flag_before_the_directory_is_a_switch() {
    let out = validate(&[
        &"--merge-domain-config",
        &fixtures().join("duplicate_domain"),
    ]);
    assert_exit(&out, 0);
}

#[test]
fn validate_command_prints_every_error_and_exits_one() {
    let names = [
        "bad_unit.yaml",
        "bad_yaml.yaml",
        "duplicate_key.yaml",
        "several_unknown_keys.yaml",
    ];
    let dir = TempDir::with_invalid("validate", &names);
    let out = validate(&[&dir.0]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ok"));
    let expected: Vec<String> = names
        .iter()
        .flat_map(|n| errors_of(n))
        .map(|e| e.to_string())
        .collect();
    assert_eq!(expected.len(), 6);
    for line in &expected {
        assert!(
            stderr.lines().any(|l| l == line),
            "missing {line:?} in:\n{stderr}"
        );
    }
}

/// What Envoy Gateway writes: a top-level `name`, and several documents in one file.
const GATEWAY: &str = r#"name: default/gateway-a
domain: gateway-a
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
---
name: default/gateway-b
domain: gateway-b
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
---
"#;

#[test]
fn every_document_of_a_file_loads_and_a_top_level_name_is_accepted() {
    let policy = config::load_sources(
        &[("gateway.yaml".into(), GATEWAY.into())],
        LoadOptions::default(),
    )
    .expect("Envoy Gateway's file loads");
    assert!(policy.domain("gateway-a").is_some());
    assert!(policy.domain("gateway-b").is_some());
    // One document with a name, as the reference's key check allows.
    let one = "name: only\ndomain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    assert!(
        config::load_sources(&[("one.yaml".into(), one.into())], LoadOptions::default()).is_ok()
    );
}

#[test]
fn errors_in_a_document_name_the_file_and_the_config() {
    let broken = GATEWAY.replace("unit: hour", "unit: fortnight");
    let errors = errors_of_text(&[("gateway.yaml", &broken)], LoadOptions::default());
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{text:?}");
    assert!(
        text[0].starts_with("gateway.yaml (default/gateway-b)")
            && text[0].contains("invalid rate limit unit 'fortnight'"),
        "{text:?}"
    );
    let unknown = GATEWAY.replace("domain: gateway-b", "domain: gateway-b\nratelimit: 1");
    let errors = errors_of_text(&[("gateway.yaml", &unknown)], LoadOptions::default());
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert!(
        text[0].starts_with("gateway.yaml (document 2)")
            && text[0].contains("unknown key 'ratelimit'"),
        "{text:?}"
    );
    // Two documents declaring one domain are a duplicate, like two files.
    let twice = GATEWAY.replace("domain: gateway-b", "domain: gateway-a");
    let errors = errors_of_text(&[("gateway.yaml", &twice)], LoadOptions::default());
    assert!(
        errors[0]
            .to_string()
            .contains("duplicate domain 'gateway-a'"),
        "{errors:?}"
    );
}
