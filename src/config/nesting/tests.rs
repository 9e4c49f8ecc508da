use super::too_deep;

use proptest::prelude::*;

/// The scan's estimate: the least bound the text stays within.
fn estimate(text: &str) -> usize {
    (0..).find(|&max| too_deep(text, max).is_none()).unwrap()
}

/// The parser's own count of nested collections (keys included).
fn parsed_depth(value: &serde_yaml::Value) -> usize {
    use serde_yaml::Value;
    match value {
        Value::Sequence(items) => 1 + items.iter().map(parsed_depth).max().unwrap_or(0),
        Value::Mapping(map) => {
            1 + map
                .iter()
                .map(|(k, v)| parsed_depth(k).max(parsed_depth(v)))
                .max()
                .unwrap_or(0)
        }
        Value::Tagged(tagged) => parsed_depth(&tagged.value),
        _ => 0,
    }
}

#[test]
fn flow_collections_nest_across_lines() {
    assert_eq!(estimate("[[{a: [1]}]]"), 4);
    assert_eq!(estimate("a: [\n  [\n    {b: [\n      1]}]]\n"), 5);
    assert_eq!(estimate("{}\n[]\n"), 1);
}

#[test]
fn block_collections_nest_by_indentation() {
    assert_eq!(estimate("a:\n  b:\n    c: 1\n  d: 2\ne: 3\n"), 3);
    assert_eq!(estimate("- a\n- b:\n    - c\n"), 3);
    // An indentless sequence is a level of its own.
    assert_eq!(estimate("a:\n- b\n- c\nd: 1\n"), 2);
    assert_eq!(
        estimate("descriptors:\n- key: a\n  descriptors:\n  - key: b\n"),
        5
    );
}

#[test]
fn compact_sequences_and_mappings_on_one_line_count_each_level() {
    assert_eq!(estimate("- - - - x\n"), 4);
    assert_eq!(estimate("- a: - b\n"), 3);
    assert_eq!(estimate("- a: 1\n  b: 2\n- c: 3\n"), 2);
    assert_eq!(estimate("? - a\n: b\n"), 2);
}

#[test]
fn brackets_in_quoted_scalars_are_not_nesting() {
    assert_eq!(estimate("a: \"[[[{{\"\n"), 1);
    assert_eq!(estimate("a: '[[ it''s [['\n"), 1);
    assert_eq!(estimate("a: \"\\\" [[[\"\n"), 1);
    // A quoted scalar spans lines; the next key is still seen.
    assert_eq!(estimate("a: \"[[\n  [[[\"\nb: [[1]]\n"), 3);
    assert_eq!(estimate("[\"]]]\", '[[[']\n"), 1);
}

#[test]
fn brackets_in_comments_are_not_nesting() {
    assert_eq!(estimate("# [[[[\na: 1 # {{{{\n"), 1);
    assert_eq!(estimate("a: [1, # ]]]]\n  2]\n"), 2);
}

#[test]
fn brackets_in_plain_and_block_scalars_are_not_nesting() {
    assert_eq!(estimate("a: x[[[{{\n"), 1);
    // Lines that continue a plain scalar are text.
    assert_eq!(estimate("a: one\n  [[[[ two\nb: 1\n"), 1);
    assert_eq!(estimate("script: |\n  [[[[\n    {{{{\nnext: [a]\n"), 2);
    assert_eq!(estimate("- |2\n   [[[[\n  {{{{\n- x\n"), 1);
}

#[test]
fn a_quote_inside_a_plain_scalar_opens_nothing() {
    // Were `'` taken for a quote, the nesting after it would be missed.
    assert_eq!(estimate("a: it's\nb: [[[[1]]]]\n"), 5);
    assert_eq!(estimate("[a 'b, [[[1]]]]\n"), 4);
    assert_eq!(estimate("a: x\n  \"\nb: [[[[1]]]]\n"), 5);
}

#[test]
fn a_pair_inside_a_flow_sequence_counts_its_mapping() {
    assert_eq!(estimate("[a: [b: c]]\n"), 4);
    assert_eq!(estimate("[[[x]: a]: b]\n"), 5);
    assert_eq!(estimate("[a]: b\n"), 2);
}

#[test]
fn every_line_break_libyaml_knows_splits_lines() {
    assert_eq!(estimate("a:\r  b:\r    c: 1\r"), 3);
    assert_eq!(estimate("a:\r\n  b: 1\r\n"), 2);
    assert_eq!(estimate("a:\u{2028}  b:\u{85}    c: 1"), 3);
}

#[test]
fn the_location_is_the_collection_that_goes_too_deep() {
    assert_eq!(too_deep(&"{a: ".repeat(100), 64), Some((1, 257)));
    assert_eq!(too_deep("a:\n  b:\n    c: 1\n", 2), Some((3, 5)));
    assert_eq!(too_deep("é: [[[1]]]\n", 2), Some((1, 5)));
    // The file of the report: 40,000 levels, found at the 65th.
    assert_eq!(too_deep(&"[".repeat(40_000), 64), Some((1, 65)));
}

#[test]
fn the_shipped_yaml_files_are_far_below_the_bound() {
    let root = crate::tests::manifest_dir();
    let mut checked = 0;
    for dir in [
        "config",
        "deploy/envoy/sluice-config",
        "deploy/kubernetes",
        "tests/fixtures",
    ] {
        let mut pending = vec![root.join(dir)];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path);
                    continue;
                }
                let name = path.to_string_lossy();
                // too_deep.yaml is the fixture of the bound.
                if !(name.ends_with(".yaml") || name.ends_with(".yml"))
                    || name.ends_with("/too_deep.yaml")
                {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let estimate = estimate(&text);
                assert!(estimate <= 16, "{name}: {estimate} levels");
                // Where the parser reads the file, the estimate is not below its count.
                for document in serde_yaml::Deserializer::from_str(&text) {
                    use serde::Deserialize as _;
                    // The invalid fixtures stop the parser; the estimate still holds for them.
                    let Ok(value) = serde_yaml::Value::deserialize(document) else {
                        break;
                    };
                    assert!(parsed_depth(&value) <= estimate, "{name}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "only {checked} files found");
}

/// A document shape, rendered in one of several layouts.
#[derive(Debug, Clone)]
enum Tree {
    Leaf(usize),
    /// Layout 0: block, 1: flow, 2: compact (`- - a`, `- k: v`) or indentless (`k:\n- a`).
    Seq(u8, Vec<Tree>),
    Map(u8, Vec<Tree>),
}

fn tree() -> impl Strategy<Value = Tree> {
    (0..FLOW_LEAVES.len())
        .prop_map(Tree::Leaf)
        .prop_recursive(10, 80, 3, |inner| {
            prop_oneof![
                (0u8..3, proptest::collection::vec(inner.clone(), 1..4))
                    .prop_map(|(layout, items)| Tree::Seq(layout, items)),
                (0u8..3, proptest::collection::vec(inner, 1..4))
                    .prop_map(|(layout, items)| Tree::Map(layout, items)),
            ]
        })
}

/// Scalars with brackets that are text, for flow context.
const FLOW_LEAVES: [&str; 4] = ["a", "'[[ it''s'", "\"{{ \\\" [\"", "x"];

/// Renders `tree` in flow layout.
fn flow(tree: &Tree, out: &mut String) {
    match tree {
        Tree::Leaf(i) => out.push_str(FLOW_LEAVES[*i]),
        Tree::Seq(_, items) | Tree::Map(_, items) => {
            let map = matches!(tree, Tree::Map(..));
            out.push(if map { '{' } else { '[' });
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if map {
                    out.push_str(&format!("k{i}: "));
                }
                flow(item, out);
            }
            out.push(if map { '}' } else { ']' });
        }
    }
}

/// Renders `tree` as the value after a `-` or `key:` already written at column `indent`;
/// `under_map` if that was a key.
fn block(tree: &Tree, indent: usize, under_map: bool, out: &mut String) {
    let pad = |n: usize| " ".repeat(n);
    match tree {
        Tree::Leaf(i) => out.push_str(&match i {
            0 => " a[b]{c\n".to_owned(),
            1 => format!(" |\n{}[[ {{{{\n{}]]\n", pad(indent + 2), pad(indent + 4)),
            2 => format!(" one\n{}[[ two # [[ {{\n", pad(indent + 2)),
            _ => format!(" \"[[\n{}{{{{\"\n", pad(indent + 2)),
        }),
        Tree::Seq(1, _) | Tree::Map(1, _) => {
            out.push(' ');
            flow(tree, out);
            out.push('\n');
        }
        Tree::Seq(layout, items) | Tree::Map(layout, items) => {
            let map = matches!(tree, Tree::Map(..));
            let compact = *layout == 2 && !under_map;
            let column = if *layout == 2 && under_map && !map {
                indent // an indentless sequence
            } else {
                indent + 2
            };
            for (i, item) in items.iter().enumerate() {
                if i == 0 && compact {
                    out.push(' ');
                } else {
                    if i == 0 {
                        out.push('\n');
                    }
                    out.push_str(&pad(column));
                }
                if map {
                    out.push_str(&format!("k{i}:"));
                } else {
                    out.push('-');
                }
                block(item, column, map, out);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// In the layouts configs are written in, the estimate is exact: over-counting would
    /// refuse good configs, under-counting would let slow ones through.
    #[test]
    fn the_estimate_is_exact_for_documents_in_every_layout(tree in tree()) {
        let mut text = "root:".to_owned();
        block(&tree, 0, true, &mut text);
        let value: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| {
            TestCaseError::fail(format!("{text}\n{e}"))
        })?;
        prop_assert_eq!(estimate(&text), parsed_depth(&value), "{}", text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever the parser accepts, the scan counts at least as deep.
    #[test]
    fn the_estimate_is_never_below_the_parsers_depth(
        pieces in proptest::collection::vec(proptest::sample::select(vec![
            "[", "]", "{", "}", ", ", ",", ": ", ":", "- ", "-", "? ", "\n", "\n  ", "\n    ",
            " ", "a", "b", "'", "\"", "\\", " #", "| ", "|1", ">", "&x ", "!t ", "*x", "\r",
        ]), 0..40)
    ) {
        let text = pieces.concat();
        if let Ok(value) = serde_yaml::from_str::<serde_yaml::Value>(&text) {
            let parsed = parsed_depth(&value);
            prop_assert!(estimate(&text) >= parsed, "{text:?}: parsed {parsed}, estimated {}", estimate(&text));
        }
    }
}
