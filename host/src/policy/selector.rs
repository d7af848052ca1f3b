//! Node selectors of `policies.yaml` rules: a metav1.LabelSelector object
//! or the string form (`k=v,k2 in (a,b),!k3`), matched with kube's own
//! `Selector`.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Expression, Selector};

/// Parses the string form of a label selector, as `kubectl -l` takes it:
/// terms separated by commas (outside parentheses), each `k=v`, `k==v`,
/// `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` or `!k`.
pub fn parse(text: &str) -> Result<Selector, String> {
    let mut expressions = Vec::new();
    for term in split_terms(text)? {
        let term = term.trim();
        if term.is_empty() {
            continue;
        }
        expressions.push(parse_term(term)?);
    }
    Ok(Selector::from_iter(expressions))
}

/// A `nodeSelector` of `policies.yaml` (a rule's, an access rule's): the
/// string form or a metav1.LabelSelector object, with how to show it.
pub fn from_value(value: &serde_json::Value) -> Result<(Selector, String), String> {
    match value {
        serde_json::Value::String(s) => parse(s).map(|sel| (sel, s.clone())),
        v @ serde_json::Value::Object(_) => from_object(v).map(|sel| (sel, v.to_string())),
        other => Err(format!("expected a label selector, found {other}")),
    }
}

/// The selector of a metav1.LabelSelector object (`matchLabels`,
/// `matchExpressions`).
pub fn from_object(value: &serde_json::Value) -> Result<Selector, String> {
    let selector: LabelSelector =
        serde_json::from_value(value.clone()).map_err(|e| format!("not a label selector: {e}"))?;
    for e in selector.match_expressions.iter().flatten() {
        if !matches!(
            e.operator.as_str(),
            "In" | "NotIn" | "Exists" | "DoesNotExist"
        ) {
            return Err(format!("unknown selector operator {:?}", e.operator));
        }
    }
    Selector::try_from(selector).map_err(|e| e.to_string())
}

fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(format!("unbalanced parentheses in {text:?}"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in {text:?}"));
    }
    terms.push(&text[start..]);
    Ok(terms)
}

fn valid_key(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_owned())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn parse_term(term: &str) -> Result<Expression, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(valid_key(key.trim())?));
    }
    for (op, not) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = term.split_once(op) {
            let (k, v) = (valid_key(k.trim())?, v.trim().to_owned());
            return Ok(if not {
                Expression::NotEqual(k, v)
            } else {
                Expression::Equal(k, v)
            });
        }
    }
    let words: Vec<&str> = term.splitn(2, char::is_whitespace).collect();
    match words.as_slice() {
        [key] => Ok(Expression::Exists(valid_key(key)?)),
        [key, rest] => {
            let rest = rest.trim();
            let (op, list) = rest
                .split_once('(')
                .ok_or_else(|| format!("unable to parse requirement: {term:?}"))?;
            let values: BTreeSet<String> = list
                .strip_suffix(')')
                .ok_or_else(|| format!("unable to parse requirement: {term:?}"))?
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect();
            match op.trim() {
                "in" => Ok(Expression::In(valid_key(key)?, values)),
                "notin" => Ok(Expression::NotIn(valid_key(key)?, values)),
                other => Err(format!("unknown selector operator {other:?}")),
            }
        }
        _ => Err(format!("unable to parse requirement: {term:?}")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::core::SelectorExt;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_string_form_matches_as_kubectl_does() {
        let s = parse("tier in (batch, ml),zone!=a,gpu,!spot,env=prod").unwrap();
        assert!(s.matches(&labels(&[
            ("tier", "ml"),
            ("zone", "b"),
            ("gpu", ""),
            ("env", "prod")
        ])));
        assert!(!s.matches(&labels(&[("tier", "web"), ("gpu", ""), ("env", "prod")])));
        assert!(!s.matches(&labels(&[
            ("tier", "ml"),
            ("gpu", ""),
            ("env", "prod"),
            ("spot", "1")
        ])));
        assert!(parse("").unwrap().selects_all());
        assert!(parse("a in (b").is_err());
        assert!(
            parse("a near (b)")
                .unwrap_err()
                .contains("unknown selector operator")
        );
        assert!(parse("bad key=1").is_err());
    }

    #[test]
    fn the_object_form_matches_and_refuses_unknown_operators() {
        let s = from_object(&serde_json::json!({"matchLabels": {"storage": "local"}})).unwrap();
        assert!(s.matches(&labels(&[("storage", "local")])));
        assert!(!s.matches(&labels(&[("storage", "net")])));
        assert!(from_object(&serde_json::json!({})).unwrap().selects_all());
        let err = from_object(
            &serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Near"}]}),
        )
        .unwrap_err();
        assert!(err.contains("unknown selector operator"), "{err}");
    }
}
