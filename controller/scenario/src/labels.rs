//! A run's labels: `key=value` pairs a user or a CI pipeline attaches to
//! a run (`--label commit=$SHA --label branch=main`), stored with it,
//! shown in its report and `pgfleet list`, and used to pick runs
//! (`pgfleet list --label`, `GET /v1/runs?label=k=v`).
//!
//! Keys are what Kubernetes and Prometheus users expect of a label name:
//! 1 to 63 characters of letters, digits, `_`, `-`, `.` and `/`, starting
//! with a letter or digit. Values are up to 256 characters of visible text
//! (no control characters). A run has at most 32 labels.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub const MAX_LABELS: usize = 32;
pub const MAX_KEY: usize = 63;
pub const MAX_VALUE: usize = 256;

/// A run's labels, ordered by key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct Labels(pub BTreeMap<String, String>);

/// One `key=value`, checked.
pub fn parse_one(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!(
            "label `{text}` has no `=`: write key=value, e.g. commit=4f2a9c1"
        ));
    };
    check_key(key)?;
    if value.chars().count() > MAX_VALUE {
        return Err(format!(
            "label `{key}`'s value is longer than {MAX_VALUE} characters"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!(
            "label `{key}`'s value has a control character (a newline or tab?)"
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

fn check_key(key: &str) -> Result<(), String> {
    let ok_first = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    let ok_rest = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'));
    if key.is_empty() || key.len() > MAX_KEY || !ok_first || !ok_rest {
        return Err(format!(
            "label key `{key}` is not a label name: 1 to {MAX_KEY} letters, digits, `_`, `-`, `.` or `/`, starting with a letter or digit"
        ));
    }
    Ok(())
}

impl Labels {
    /// Labels from `key=value` texts (each `--label`): a key given twice,
    /// or more than `MAX_LABELS`, is an error naming it.
    pub fn parse<S: AsRef<str>>(texts: &[S]) -> Result<Labels, String> {
        let mut map = BTreeMap::new();
        for t in texts {
            let (k, v) = parse_one(t.as_ref())?;
            if let Some(old) = map.insert(k.clone(), v.clone()) {
                return Err(format!(
                    "label `{k}` is given twice (`{k}={old}` and `{k}={v}`): give each key once"
                ));
            }
        }
        if map.len() > MAX_LABELS {
            return Err(format!(
                "{} labels: a run takes at most {MAX_LABELS}",
                map.len()
            ));
        }
        Ok(Labels(map))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every `key=value` of `filter` is among these labels.
    pub fn matches(&self, filter: &Labels) -> bool {
        filter.0.iter().all(|(k, v)| self.0.get(k) == Some(v))
    }

    /// The stored form (a JSON object).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_else(|_| "{}".into())
    }

    /// From the stored form; a run stored before labels has none.
    pub fn from_json(text: Option<&str>) -> Labels {
        text.and_then(|t| serde_json::from_str(t).ok())
            .map(Labels)
            .unwrap_or_default()
    }
}

impl fmt::Display for Labels {
    /// `k=v, k2=v2` (empty when there are none).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_order_by_key() {
        let l =
            Labels::parse(&["pg=17.2", "commit=4f2a9c1", "branch=feature/x", "empty="]).unwrap();
        assert_eq!(
            l.to_string(),
            "branch=feature/x, commit=4f2a9c1, empty=, pg=17.2"
        );
        // A value may hold `=`.
        let l = Labels::parse(&["opts=a=b"]).unwrap();
        assert_eq!(l.0["opts"], "a=b");
        assert_eq!(Labels::from_json(Some(&l.to_json())), l);
        assert_eq!(Labels::from_json(None), Labels::default());
    }

    #[test]
    fn bad_labels_are_refused_saying_why() {
        let err = |t: &[&str]| Labels::parse(t).unwrap_err();
        assert!(err(&["commit"]).contains("no `="), "{}", err(&["commit"]));
        assert!(err(&["=x"]).contains("not a label name"));
        assert!(err(&["-x=1"]).contains("starting with a letter or digit"));
        assert!(err(&["a b=1"]).contains("not a label name"));
        assert!(err(&[&format!("{}=1", "k".repeat(64))]).contains("63"));
        assert!(err(&[&format!("k={}", "v".repeat(257))]).contains("256"));
        assert!(err(&["k=a\nb"]).contains("control character"));
        let twice = err(&["commit=a", "commit=b"]);
        assert!(
            twice.contains("given twice")
                && twice.contains("commit=a")
                && twice.contains("commit=b"),
            "{twice}"
        );
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(Labels::parse(&many).unwrap_err().contains("at most 32"));
    }

    #[test]
    fn a_filter_matches_runs_carrying_all_its_labels() {
        let run = Labels::parse(&["commit=abc", "branch=main"]).unwrap();
        assert!(run.matches(&Labels::default()));
        assert!(run.matches(&Labels::parse(&["branch=main"]).unwrap()));
        assert!(run.matches(&Labels::parse(&["branch=main", "commit=abc"]).unwrap()));
        assert!(!run.matches(&Labels::parse(&["branch=dev"]).unwrap()));
        assert!(!run.matches(&Labels::parse(&["branch=main", "pg=17"]).unwrap()));
        assert!(!run.matches(&Labels::parse(&["branch="]).unwrap()));
    }
}
