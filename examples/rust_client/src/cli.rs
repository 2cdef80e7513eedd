//! What the two binaries share: `--name value` arguments and JSON output, without
//! dependencies.

use std::collections::HashMap;
use std::fmt::Write;
use std::str::FromStr;

/// Parsed `--name value` pairs; every name must be one of `known`.
#[derive(Debug)]
pub struct Args {
    values: HashMap<String, String>,
}

impl Args {
    /// Parses `args` (without the program name). `--help` returns `Err(usage)`.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        known: &[&str],
        usage: &str,
    ) -> Result<Self, String> {
        let mut values = HashMap::new();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            if arg == "--help" || arg == "-h" {
                return Err(usage.to_owned());
            }
            let (name, inline) = match arg.strip_prefix("--") {
                Some(rest) => match rest.split_once('=') {
                    Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                    None => (rest.to_owned(), None),
                },
                None => return Err(format!("unexpected argument {arg:?}\n{usage}")),
            };
            if !known.contains(&name.as_str()) {
                return Err(format!("unknown option --{name}\n{usage}"));
            }
            let value = match inline {
                Some(v) => v,
                None => it.next().ok_or_else(|| format!("--{name} needs a value"))?,
            };
            values.insert(name, value);
        }
        Ok(Self { values })
    }

    /// The option's value, if given.
    pub fn get<T: FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        self.values
            .get(name)
            .map(|v| v.parse().map_err(|_| format!("--{name}: cannot read {v:?}")))
            .transpose()
    }

    /// The option's value or `default`.
    pub fn get_or<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        Ok(self.get(name)?.unwrap_or(default))
    }
}

/// `s` as a JSON string literal.
#[must_use]
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A finite number as JSON (Rust's shortest round-trip form); NaN and infinities as `null`.
#[must_use]
pub fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values are compared bit for bit on purpose
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn options_parse_in_both_forms() {
        let a =
            Args::parse(strings(&["--clients", "4", "--seconds=2.5"]), &["clients", "seconds", "token"], "u")
                .unwrap();
        assert_eq!(a.get::<usize>("clients").unwrap(), Some(4));
        assert_eq!(a.get_or("seconds", 1.0).unwrap(), 2.5);
        assert_eq!(a.get::<String>("token").unwrap(), None);
        assert!(Args::parse(strings(&["--nope", "1"]), &["clients"], "u").is_err());
        assert!(Args::parse(strings(&["--clients"]), &["clients"], "u").is_err());
        assert!(Args::parse(strings(&["--clients", "x"]), &["clients"], "u")
            .unwrap()
            .get::<u32>("clients")
            .is_err());
        assert_eq!(Args::parse(strings(&["--help"]), &[], "usage").unwrap_err(), "usage");
    }

    #[test]
    fn json_output_escapes() {
        assert_eq!(json_string("a\"b\\c\n\u{1}é"), r#""a\"b\\c\n\u0001é""#);
        assert_eq!(json_number(2.0), "2");
        assert_eq!(json_number(0.1), "0.1");
        assert_eq!(json_number(f64::NAN), "null");
    }
}
