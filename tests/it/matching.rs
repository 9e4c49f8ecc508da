// Why one long file: one table of matching cases; a table reads best whole.
//! Descriptor matching, as a table in the spirit of the reference service's config tests:
//! descriptor entries → the rule found (named by its stats key) or none. The configs are
//! our own, written inline: a `basic` domain shaped like the reference's basic config, a
//! `wildcard` domain and a `share` domain.

use std::sync::OnceLock;

use sluice::config::{LoadOptions, load_sources};
use sluice::policy::{Policy, Rule, RuleLimit, Unit};

const BASIC: &str = r#"
domain: basic
descriptors:
  - key: key1
    value: value1
    descriptors:
      - {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}}
      - key: subkey1
        value: subvalue1
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2, value: value2, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 30}}
  - {key: key2, value: value3}
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: key4, rate_limit: {unit: day, requests_per_unit: 1, name: key4_rate_limit}}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - {key: subkey5, value: subvalue5, rate_limit: {unit: day, requests_per_unit: 25}}
  - {key: key6, rate_limit: {unlimited: true}}
  - key: key7
    detailed_metric: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
  - key: key8
    rate_limit:
      unit: minute
      requests_per_unit: 80
      name: key8_rate_limit
      replaces: [{name: key4_rate_limit}, {name: elsewhere}]
"#;

const WILDCARD: &str = r#"
domain: wildcard
descriptors:
  - {key: wild, value: "foo*", rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: wild, value: "fo*", rate_limit: {unit: minute, requests_per_unit: 11}}
  - {key: wild, value: foobar, rate_limit: {unit: minute, requests_per_unit: 12}}
  - {key: wild, rate_limit: {unit: minute, requests_per_unit: 13}}
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noVal, rate_limit: {unit: minute, requests_per_unit: 21}}
  - {key: midWild, value: "bar*b", rate_limit: {unit: minute, requests_per_unit: 22}}
  - {key: multiWild, value: "foo*bar*baz", rate_limit: {unit: minute, requests_per_unit: 23}}
  - {key: any, value: "*", rate_limit: {unit: minute, requests_per_unit: 24}}
  - key: nestedWild
    value: val1
    descriptors:
      - {key: wild, value: "goo*", rate_limit: {unit: minute, requests_per_unit: 30}}
  - key: backtrack
    value: "a*"
    descriptors:
      - {key: child, value: x, rate_limit: {unit: minute, requests_per_unit: 40}}
  - key: backtrack
    rate_limit: {unit: minute, requests_per_unit: 41}
    descriptors:
      - {key: child, value: y, rate_limit: {unit: minute, requests_per_unit: 42}}
  - {key: script, value: "ünï*çødé", rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: script, value: "x*é", rate_limit: {unit: minute, requests_per_unit: 51}}
  - {key: emoji, value: "*🚀", rate_limit: {unit: minute, requests_per_unit: 52}}
  - {key: city, value: 東京, rate_limit: {unit: minute, requests_per_unit: 53}}
"#;

const SHARE: &str = r#"
domain: share
descriptors:
  - key: files
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}
  - key: file
    value: "test*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: "path/*"
    share_threshold: true
    descriptors:
      - key: file
        value: "file/*"
        descriptors:
          - {key: type, rate_limit: {unit: minute, requests_per_unit: 60}}
  - key: tenant
    value: "t*prod"
    share_threshold: true
    descriptors:
      - key: resource
        value: "res*v2"
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 70}
"#;

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let sources = [
            ("basic.yaml", BASIC),
            ("wildcard.yaml", WILDCARD),
            ("share.yaml", SHARE),
        ]
        .map(|(name, text)| (name.to_owned(), text.to_owned()));
        load_sources(&sources, LoadOptions::default()).unwrap_or_else(|e| panic!("{e:#?}"))
    })
}

fn find(domain: &str, entries: &[(&str, &str)]) -> Option<&'static Rule> {
    policy().domain(domain).unwrap().find(entries)
}

fn rule(domain: &str, entries: &[(&str, &str)]) -> &'static Rule {
    find(domain, entries).unwrap_or_else(|| panic!("no rule for {domain} {entries:?}"))
}

/// Requests per unit and unit of a limited rule.
fn limit(rule: &Rule) -> (u64, Unit) {
    match &rule.limit {
        RuleLimit::Limited(l) => (l[0].requests_per_unit, l[0].unit),
        RuleLimit::Unlimited => panic!("{} is unlimited", rule.stats_key),
    }
}

/// A descriptor written `key=value,key=value` (values here hold no `,` or `=`).
fn entries(descriptor: &str) -> Vec<(&str, &str)> {
    descriptor
        .split(',')
        .filter(|entry| !entry.is_empty())
        .map(|entry| entry.split_once('=').expect("key=value"))
        .collect()
}

/// Asserts each row, `descriptor => stats key of the matched rule` (`-` for no rule).
fn assert_table(domain: &str, table: &[&str]) {
    for row in table {
        let (descriptor, expected) = row.split_once(" => ").expect("descriptor => key");
        let expected = Some(expected.trim()).filter(|&key| key != "-");
        let found = find(domain, &entries(descriptor.trim())).map(|r| r.stats_key.as_str());
        assert_eq!(found, expected, "{domain} {descriptor}");
    }
}

#[test]
fn unknown_domain_and_empty_descriptor_match_nothing() {
    assert!(policy().domain("foo_domain").is_none());
    assert!(find("basic", &[]).is_none());
    assert_eq!(policy().domain_count(), 3);
}

#[test]
fn basic_descriptors_resolve_like_the_reference_basic_config() {
    assert_table(
        "basic",
        &[
            "key1=something => -",
            "key1=value1 => -",
            "key1=value1,subkey1=something => basic.key1_value1.subkey1",
            "key1=value1,subkey1=subvalue1 => basic.key1_value1.subkey1_subvalue1",
            "key2=something => basic.key2",
            "key2=value2 => basic.key2_value2",
            "key2=value3 => -",
            "key3=x => basic.key3",
            "key4=x => basic.key4",
            "key6=x => basic.key6",
            "key7=unspecified_value => basic.key7",
            "unknown=x => -",
        ],
    );
    let rows = [
        ("key1=value1,subkey1=something", (5, Unit::Second)),
        ("key1=value1,subkey1=subvalue1", (10, Unit::Second)),
        ("key2=something", (20, Unit::Minute)),
        ("key2=value2", (30, Unit::Minute)),
        ("key3=x", (1, Unit::Hour)),
        ("key4=x", (1, Unit::Day)),
    ];
    for (descriptor, expected) in rows {
        let found = limit(rule("basic", &entries(descriptor)));
        assert_eq!(found, expected, "{descriptor}");
    }
}

#[test]
fn exact_value_beats_wildcard_and_key_only() {
    assert_table(
        "wildcard",
        &[
            "wild=foobar => wildcard.wild_foobar",
            "wild=foo1 => wildcard.wild_foo*",
            "wild=bar => wildcard.wild",
            "wild= => wildcard.wild",
        ],
    );
}

#[test]
fn first_matching_wildcard_in_config_order_wins() {
    // `foo*` and `fo*` both match `foo1`; `foo*` comes first. Only `fo*` matches `fox`.
    assert_eq!(limit(rule("wildcard", &[("wild", "foo1")])).0, 10);
    assert_eq!(limit(rule("wildcard", &[("wild", "foo")])).0, 10);
    assert_eq!(limit(rule("wildcard", &[("wild", "fox")])).0, 11);
}

#[test]
fn a_level_choice_is_final_without_backtracking() {
    // `abc` takes the `a*` branch, which has no `child=y`; the key-only branch that does
    // is not tried.
    assert_table(
        "wildcard",
        &[
            "backtrack=abc,child=x => wildcard.backtrack_a*.child_x",
            "backtrack=abc,child=y => -",
            "backtrack=zzz,child=y => wildcard.backtrack.child_y",
            "backtrack=zzz,child=x => -",
        ],
    );
}

#[test]
fn a_rule_applies_only_at_the_exact_descriptor_depth() {
    assert_table(
        "basic",
        &[
            // Deeper than the config: nothing.
            "key2=value2,subkey=subvalue => -",
            "key3=x,extra=y => -",
            // No child matches: the parent's own limit is not used.
            "key5=value5,subkey5=subvalue => -",
            "key5=value5 => basic.key5_value5",
            "key5=value5,subkey5=subvalue5 => basic.key5_value5.subkey5_subvalue5",
            // Entry order matters: the tree is walked from the first entry.
            "subkey1=subvalue1,key1=value1 => -",
        ],
    );
    assert_eq!(limit(rule("basic", &[("key5", "value5")])), (15, Unit::Day));
}

#[test]
fn a_matched_node_without_rate_limit_is_a_whitelist() {
    assert!(find("basic", &[("key2", "value3")]).is_none());
    assert!(find("basic", &[("key1", "value1")]).is_none());
    // The whitelisted value does not fall back to the key-only rule of its siblings.
    assert!(find("basic", &[("key2", "value4")]).is_some());
}

#[test]
fn unlimited_rule_is_reported_as_unlimited() {
    let key6 = rule("basic", &[("key6", "anything")]);
    assert_eq!(key6.limit, RuleLimit::Unlimited);
    assert_eq!(key6.stats_key, "basic.key6");
}

#[test]
fn names_and_replaces_are_recorded() {
    assert_eq!(rule("basic", &[("key3", "x")]).name, None);
    let key4 = rule("basic", &[("key4", "x")]);
    assert_eq!(key4.name.as_deref(), Some("key4_rate_limit"));
    assert!(key4.replaces.is_empty());
    let key8 = rule("basic", &[("key8", "x")]);
    assert_eq!(key8.name.as_deref(), Some("key8_rate_limit"));
    assert_eq!(key8.replaces, ["key4_rate_limit", "elsewhere"]);
}

#[test]
fn mode_and_metric_flags_follow_the_matched_node() {
    let shadow = rule("basic", &[("key1", "value1"), ("subkey1", "subvalue1")]);
    assert!(shadow.shadow_mode && !shadow.quota_mode);
    assert!(!rule("basic", &[("key1", "value1"), ("subkey1", "other")]).shadow_mode);
    let quota = rule("basic", &[("key2", "value2")]);
    assert!(quota.quota_mode && !quota.shadow_mode);
    assert!(!rule("basic", &[("key2", "other")]).quota_mode);
    let key7 = rule("basic", &[("key7", "v")]);
    assert!(key7.detailed_metric && key7.value_to_metric);
    let key3 = rule("basic", &[("key3", "v")]);
    assert!(!key3.detailed_metric && !key3.value_to_metric);
}

#[test]
fn wildcards_in_the_middle_and_several_wildcards() {
    assert_table(
        "wildcard",
        &[
            "midWild=barab => wildcard.midWild_bar*b",
            "midWild=bar123b => wildcard.midWild_bar*b",
            "midWild=barb => wildcard.midWild_bar*b",
            "midWild=bara => -",
            "midWild=xbarb => -",
            "multiWild=foobarbaz => wildcard.multiWild_foo*bar*baz",
            "multiWild=foo123bar456baz => wildcard.multiWild_foo*bar*baz",
            "multiWild=foobarbarbaz => wildcard.multiWild_foo*bar*baz",
            "multiWild=foo123baz => -",
            "multiWild=bar456baz => -",
            "any= => wildcard.any_*",
            "any=anything at all => wildcard.any_*",
        ],
    );
}

#[test]
fn exact_values_and_patterns_never_match_more_than_written() {
    assert_table(
        "wildcard",
        &[
            "noWild=foo => wildcard.noWild_foo",
            "noWild=foo1 => -",
            "noVal=a => wildcard.noVal",
            "noVal=b => wildcard.noVal",
            "noVal= => wildcard.noVal",
            // A pattern belongs to its key: `foo*` of `wild` says nothing about `other`.
            "other=foo1 => -",
            // Keys are exact too.
            "Wild=foo1 => -",
        ],
    );
}

#[test]
fn nested_wildcard_below_an_exact_parent() {
    assert_table(
        "wildcard",
        &[
            "nestedWild=val1,wild=goo2 => wildcard.nestedWild_val1.wild_goo*",
            "nestedWild=val1,wild=foo2 => -",
            "nestedWild=val2,wild=goo2 => -",
            "nestedWild=val1 => -",
        ],
    );
}

#[test]
fn multibyte_values_match_by_characters() {
    assert_table(
        "wildcard",
        &[
            "script=ünïçødé => wildcard.script_ünï*çødé",
            "script=ünï→çødé => wildcard.script_ünï*çødé",
            "script=uniçødé => -",
            "script=xé => wildcard.script_x*é",
            // The suffix `é` (2 bytes) would start inside `€` (3 bytes): no match, no panic.
            "script=x€ => -",
            "script=x© => -",
            "emoji=🚀 => wildcard.emoji_*🚀",
            "emoji=go 🚀 => wildcard.emoji_*🚀",
            "emoji=🚀 go => -",
            "city=東京 => wildcard.city_東京",
            "city=東 => -",
        ],
    );
}

#[test]
fn share_threshold_records_the_shared_pattern_per_level() {
    assert_table(
        "share",
        &[
            "files=files/a.txt => share.files_files/*",
            // An exact value beside a shared wildcard keeps its own rule and counter.
            "file=test1 => share.file_test1",
            "file=test2 => share.file_test*",
            "file=test123 => share.file_test*",
            "path=path/a,file=file/b,type=pdf => share.path_path/*.file_file/*.type",
            "tenant=t1prod,resource=resAv2 => share.tenant_t*prod.resource_res*v2",
        ],
    );
    assert_eq!(limit(rule("share", &[("file", "test1")])).0, 50);
    assert_eq!(limit(rule("share", &[("file", "test2")])).0, 100);
    // `Rule.shared`, one pattern per level (`-` where the level shares nothing). A shared
    // parent without a rate limit still counts; a wildcard without share_threshold does not.
    for row in [
        "files=files/a.txt => files/*",
        "file=test1 => -",
        "file=test23 => test*",
        "path=path/a,file=file/b,type=pdf => path/* - -",
        "tenant=t1prod,resource=resAv2 => t*prod res*v2",
    ] {
        let (descriptor, expected) = row.split_once(" => ").unwrap();
        let rule = rule("share", &entries(descriptor));
        let shared: Vec<&str> = rule
            .shared
            .iter()
            .map(|p| p.as_deref().unwrap_or("-"))
            .collect();
        assert_eq!(shared.join(" "), expected, "{descriptor}");
    }
    assert_eq!(rule("basic", &[("key2", "x")]).shared, [None]);
}

#[test]
fn every_rule_is_listed_once_by_stats_key() {
    let basic: Vec<&str> = policy()
        .rules()
        .iter()
        .map(|r| r.stats_key.as_str())
        .filter(|k| k.starts_with("basic."))
        .collect();
    assert_eq!(
        basic,
        [
            "basic.key1_value1.subkey1",
            "basic.key1_value1.subkey1_subvalue1",
            "basic.key2",
            "basic.key2_value2",
            "basic.key3",
            "basic.key4",
            "basic.key5_value5",
            "basic.key5_value5.subkey5_subvalue5",
            "basic.key6",
            "basic.key7",
            "basic.key8",
        ]
    );
}

#[test]
fn failure_mode_comes_from_the_rule_then_enclosing_descriptors_then_the_file() {
    use sluice::store::FailureMode;
    let yaml = r#"
domain: fm
failure_mode: deny
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: open
    failure_mode: ALLOW
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: inner
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: own
        failure_mode: local
        rate_limit: {unit: second, requests_per_unit: 1}
"#;
    let policy = load_sources(&[("fm.yaml".into(), yaml.into())], LoadOptions::default()).unwrap();
    let domain = policy.domain("fm").unwrap();
    assert_eq!(domain.failure_mode, Some(FailureMode::Deny));
    let mode = |entries: &[(&str, &str)]| domain.find(entries).unwrap().failure_mode;
    assert_eq!(mode(&[("plain", "x")]), Some(FailureMode::Deny));
    assert_eq!(mode(&[("open", "x")]), Some(FailureMode::Allow));
    assert_eq!(
        mode(&[("open", "x"), ("inner", "y")]),
        Some(FailureMode::Allow)
    );
    assert_eq!(
        mode(&[("open", "x"), ("own", "y")]),
        Some(FailureMode::Local)
    );

    let without = "domain: none\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let policy = load_sources(
        &[("none.yaml".into(), without.into())],
        LoadOptions::default(),
    )
    .unwrap();
    let rule = policy.domain("none").unwrap().find(&[("k", "v")]).unwrap();
    assert_eq!(rule.failure_mode, None, "the process default applies");
}
