//! Rule `metadata`: free-form values from the config, merged into the response's dynamic
//! metadata as the reference service does (deep merge; on a conflict the first value wins).

use std::collections::BTreeMap;

/// A metadata value, independent of YAML and of protobuf.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `null` / `~`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// Any number.
    Number(f64),
    /// A string.
    String(String),
    /// A sequence.
    List(Vec<MetaValue>),
    /// A mapping with string keys.
    Map(BTreeMap<String, MetaValue>),
}

impl MetaValue {
    /// Converts YAML; non-string mapping keys are written as YAML text.
    pub fn from_yaml(value: &serde_yaml::Value) -> Self {
        use serde_yaml::Value;
        match value {
            Value::Null => MetaValue::Null,
            Value::Bool(b) => MetaValue::Bool(*b),
            Value::Number(n) => MetaValue::Number(n.as_f64().unwrap_or(0.0)),
            Value::String(s) => MetaValue::String(s.clone()),
            Value::Sequence(items) => MetaValue::List(items.iter().map(Self::from_yaml).collect()),
            Value::Mapping(map) => MetaValue::Map(
                map.iter()
                    .map(|(k, v)| {
                        let key = match k {
                            Value::String(s) => s.clone(),
                            other => serde_yaml::to_string(other)
                                .map(|s| s.trim_end().to_owned())
                                .unwrap_or_default(),
                        };
                        (key, Self::from_yaml(v))
                    })
                    .collect(),
            ),
            Value::Tagged(tagged) => Self::from_yaml(&tagged.value),
        }
    }
}

/// Merges `from` into `into`: maps merge key by key, recursively; otherwise the value already
/// in `into` stays (the first descriptor's value wins).
pub fn merge_into(into: &mut BTreeMap<String, MetaValue>, from: &BTreeMap<String, MetaValue>) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(MetaValue::Map(existing)), MetaValue::Map(more)) => merge_into(existing, more),
            (Some(_), _) => {}
            (None, value) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(yaml: &str) -> BTreeMap<String, MetaValue> {
        match MetaValue::from_yaml(&serde_yaml::from_str(yaml).unwrap()) {
            MetaValue::Map(m) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn maps_merge_deeply_and_the_first_scalar_wins() {
        let mut merged = map("team: a\nservice: {name: s1, tier: 1}\n");
        merge_into(
            &mut merged,
            &map("team: b\nservice: {name: s2, owner: o}\nextra: [1, 2]\n"),
        );
        assert_eq!(
            merged,
            map("team: a\nservice: {name: s1, tier: 1, owner: o}\nextra: [1, 2]\n")
        );
    }
}
