//! Label and field selectors, as `?labelSelector=` and `?fieldSelector=`
//! take them.

use std::collections::BTreeSet;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set(s: &str) -> Result<BTreeSet<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, found {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(key) = part.strip_prefix('!') {
                Req::NotExists(key.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(v)?)
            } else if part
                .chars()
                .all(|c| c.is_alphanumeric() || "-_./".contains(c))
            {
                Req::Exists(part.to_owned())
            } else {
                return Err(format!("unable to parse requirement: {part:?}"));
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// A `metav1.LabelSelector` object (matchLabels / matchExpressions).
    pub fn from_object(sel: &Value) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if let Some(m) = sel["matchLabels"].as_object() {
            for (k, v) in m {
                reqs.push(Req::Eq(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        for e in sel["matchExpressions"].as_array().into_iter().flatten() {
            let key = e["key"].as_str().unwrap_or_default().to_owned();
            let values: BTreeSet<String> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            reqs.push(match e["operator"].as_str() {
                Some("In") => Req::In(key, values),
                Some("NotIn") => Req::NotIn(key, values),
                Some("Exists") => Req::Exists(key),
                Some("DoesNotExist") => Req::NotExists(key),
                other => return Err(format!("unknown selector operator {other:?}")),
            });
        }
        Ok(LabelSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object's `metadata.labels` match.
    pub fn matches(&self, labels: &Value) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A JSON string map as `k=v,k=v` (how selectors print).
pub fn to_string(map: &Value) -> String {
    map.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid field selector: {part:?}"));
            };
            reqs.push((k.trim().to_owned(), eq, v.trim().to_owned()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value a field selector compares: the field as a string, empty
    /// when missing.
    pub fn field(obj: &Value, path: &str) -> String {
        Self::text(obj, path).into_owned()
    }

    /// [`field`](Self::field), without a copy when the field is a string
    /// (the usual case).
    pub(crate) fn text<'a>(obj: &'a Value, path: &str) -> std::borrow::Cow<'a, str> {
        let mut v = obj;
        for part in path.split('.') {
            v = &v[part];
        }
        match v {
            Value::String(s) => s.as_str().into(),
            Value::Bool(b) => b.to_string().into(),
            Value::Number(n) => n.to_string().into(),
            _ => "".into(),
        }
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(k, eq, v)| (Self::text(obj, k) == v.as_str()) == *eq)
    }

    /// The value this selector requires for `field`, if it pins one (used
    /// to answer `spec.nodeName=x` lists from an index).
    pub fn pinned(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| *eq && k == field)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors_follow_kubernetes_syntax() {
        let labels = json!({"app": "web", "tier": "front", "env": "prod"});
        for (sel, expected) in [
            ("", true),
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app=web,env in (dev,staging)", false),
        ] {
            let s = LabelSelector::parse(sel).unwrap();
            assert_eq!(s.matches(&labels), expected, "{sel}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selectors_compare_strings_and_booleans() {
        let pod =
            json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1", "unschedulable": true}});
        let s = FieldSelector::parse("spec.nodeName=n1,metadata.name!=b").unwrap();
        assert!(s.matches(&pod));
        assert_eq!(s.pinned("spec.nodeName"), Some("n1"));
        assert!(
            FieldSelector::parse("spec.unschedulable=true")
                .unwrap()
                .matches(&pod)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName=n2")
                .unwrap()
                .matches(&pod)
        );
        assert!(FieldSelector::parse("spec.missing=").unwrap().matches(&pod));
    }
}
