//! Typed settings from the environment: one definition per variable.
//!
//! Each component declares its variables as [`Setting`] constants next to the code
//! they configure: the name, what it configures, the default as a typed value and
//! the parser. Parsing follows linkerd2-proxy's `env.rs`: an [`Env`] reads every
//! variable, collects every problem, and fails once with all of them (the binary
//! exits with status 2). Command-line flags mirror these variables and take
//! precedence; the binary passes them in through the lookup function.

use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;

/// How a variable's value is turned into `T` and shown again (for docs and errors).
pub struct Parser<T: 'static> {
    /// Text → value; the error says what was expected, never echoes a secret.
    pub parse: fn(&str) -> Result<T, String>,
    /// Value → the text a user would write.
    pub show: fn(&T) -> String,
}

/// What a variable means when it is not set.
pub enum Fallback<T: 'static> {
    /// No default: the variable is optional or required, as the reader says.
    Unset,
    /// This value.
    Value(fn() -> T),
    /// Computed from other settings (described for the docs).
    Derived(&'static str),
}

/// One documented environment variable, with its typed default and parser.
pub struct Setting<T: 'static> {
    /// Variable name; the flag that mirrors it is the same in kebab case.
    pub name: &'static str,
    /// What it configures.
    pub doc: &'static str,
    /// Its meaning when unset.
    pub fallback: Fallback<T>,
    /// How its text becomes a value.
    pub parser: Parser<T>,
    /// Its value may hold a password or key: errors never echo it.
    pub secret: bool,
    /// Set to the empty text, it has that value (a template that sends
    /// nothing) instead of counting as unset, as every other setting does.
    pub empty_is_a_value: bool,
}

impl<T: 'static> Setting<T> {
    /// A setting whose value is safe to echo in an error.
    pub const fn new(
        name: &'static str,
        parser: Parser<T>,
        fallback: Fallback<T>,
        doc: &'static str,
    ) -> Self {
        Setting {
            name,
            doc,
            fallback,
            parser,
            secret: false,
            empty_is_a_value: false,
        }
    }

    /// A setting whose value may hold a secret (a URL with a password, a key).
    pub const fn secret(
        name: &'static str,
        parser: Parser<T>,
        fallback: Fallback<T>,
        doc: &'static str,
    ) -> Self {
        Setting {
            secret: true,
            ..Setting::new(name, parser, fallback, doc)
        }
    }

    /// The same setting, for which the empty text is a value (see
    /// [`Setting::empty_is_a_value`]).
    pub const fn with_empty_as_a_value(mut self) -> Self {
        self.empty_is_a_value = true;
        self
    }

    /// The default, as a typed value, when there is one.
    pub fn default_value(&self) -> Option<T> {
        match &self.fallback {
            Fallback::Value(make) => Some(make()),
            _ => None,
        }
    }

    /// The default of a setting that has a fixed one: what a config struct's
    /// `Default` uses, so a default is written once, in its setting.
    ///
    /// # Panics
    /// When the setting has no fixed default (a programming error that any
    /// test building the `Default` finds).
    pub fn fixed_default(&self) -> T {
        match &self.fallback {
            Fallback::Value(make) => make(),
            _ => panic!("{} has no fixed default", self.name),
        }
    }
}

/// A setting of any type, as the documentation and the README check see it.
pub trait Documented: Sync {
    /// Variable name.
    fn name(&self) -> &'static str;
    /// What it configures.
    fn doc(&self) -> &'static str;
    /// The default as a user would write it; empty when there is none.
    fn default_text(&self) -> String;
    /// Its value may hold a secret: never printed, injected as an ECS secret.
    fn secret(&self) -> bool {
        false
    }
}

impl<T: 'static> Documented for Setting<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn default_text(&self) -> String {
        match &self.fallback {
            Fallback::Unset => String::new(),
            Fallback::Value(make) => (self.parser.show)(&make()),
            Fallback::Derived(text) => (*text).to_owned(),
        }
    }
    fn secret(&self) -> bool {
        self.secret
    }
}

/// A variable that is documented and read by a tool other than leasehold's own
/// parsers (the AWS SDK, the ECS agent): listed for the docs, never parsed here.
pub struct External {
    /// Variable name.
    pub name: &'static str,
    /// What it configures.
    pub doc: &'static str,
}

impl Documented for External {
    fn name(&self) -> &'static str {
        self.name
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn default_text(&self) -> String {
        String::new()
    }
}

/// All configuration problems found, reported together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .problems.join("\n  - "))]
pub struct ConfigError {
    /// One line per bad value, naming the variable.
    pub problems: Vec<String>,
}

impl ConfigError {
    /// One problem, found outside the environment's parsing (a flag, a table
    /// declared in another mode).
    pub fn one(problem: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![problem.into()],
        }
    }
}

/// Where variables come from: the process environment, or fixed pairs.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Reads settings and collects every problem before failing once.
pub struct Env<'a> {
    lookup: Lookup<'a>,
    problems: Vec<String>,
}

impl<'a> Env<'a> {
    /// Reads from `lookup`; empty values count as unset, except for settings
    /// whose empty text is a value ([`Setting::with_empty_as_a_value`]).
    pub fn new(lookup: Lookup<'a>) -> Self {
        Env {
            lookup,
            problems: Vec::new(),
        }
    }

    /// The raw text of a variable, if set and not empty.
    pub fn raw(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|value| !value.is_empty())
    }

    /// The parsed value, or `None` when unset or invalid (the problem is recorded).
    pub fn optional<T>(&mut self, setting: &Setting<T>) -> Option<T> {
        let raw = (self.lookup)(setting.name)
            .filter(|value| setting.empty_is_a_value || !value.is_empty())?;
        match (setting.parser.parse)(raw.trim()) {
            Ok(value) => Some(value),
            Err(problem) if setting.secret => {
                self.problems.push(format!("{}: {problem}", setting.name));
                None
            }
            Err(problem) => {
                self.problems
                    .push(format!("{}: {problem} (got {raw:?})", setting.name));
                None
            }
        }
    }

    /// The parsed value, else the setting's default. A setting without a value
    /// default must be read with [`Env::optional`], [`Env::required`] or
    /// [`Env::or`]: asking here is a bug caught by the settings tests.
    pub fn get<T>(&mut self, setting: &Setting<T>) -> T {
        match self.optional(setting) {
            Some(value) => value,
            None => setting
                .default_value()
                .unwrap_or_else(|| panic!("{} has no default value", setting.name)),
        }
    }

    /// The parsed value, else `derived` (for defaults computed from other settings).
    pub fn or<T>(&mut self, setting: &Setting<T>, derived: T) -> T {
        self.optional(setting).unwrap_or(derived)
    }

    /// The parsed value; a problem when unset.
    pub fn required<T>(&mut self, setting: &Setting<T>, purpose: &str) -> Option<T> {
        if self.raw(setting.name).is_none() {
            self.problems
                .push(format!("{}: is required {purpose}", setting.name));
            return None;
        }
        self.optional(setting)
    }

    /// Records a problem with a setting found by a check across settings.
    pub fn problem(&mut self, name: &str, problem: impl Display) {
        self.problems.push(format!("{name}: {problem}"));
    }

    /// Whether any problem was recorded so far.
    pub fn has_problems(&self) -> bool {
        !self.problems.is_empty()
    }

    /// `value` when nothing was wrong, else every problem at once.
    pub fn finish<T>(self, value: T) -> Result<T, ConfigError> {
        if self.problems.is_empty() {
            Ok(value)
        } else {
            Err(ConfigError {
                problems: self.problems,
            })
        }
    }
}

/// Reads variables from the process environment as they are: an empty value
/// is `Some("")`, which [`Env`] counts as unset except for the settings whose
/// empty text is a value (`UPSTREAM_SUBSCRIBE=""` sends nothing).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A lookup over fixed values: tests, and embedders that configure components
/// in code (`dev`).
pub fn fixed_lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

/// A setting's value that must never be printed (a URL that may hold a
/// password): `Debug` shows `[redacted]`, so a settings struct that derives
/// `Debug` cannot leak it; [`Redacted::expose`] hands it to the one call that
/// connects with it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redacted<T>(T);

impl<T> Redacted<T> {
    /// Wraps a secret value.
    pub fn new(value: T) -> Self {
        Redacted(value)
    }

    /// The value itself, for the code that uses it (never for a log line).
    pub fn expose(&self) -> &T {
        &self.0
    }

    /// The value itself, by value.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Redacted<T> {
    fn from(value: T) -> Self {
        Redacted(value)
    }
}

impl<T> std::fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// The parsers every component shares; each says what it expects.
pub mod parse {
    use super::*;

    fn whole(raw: &str) -> Result<u64, String> {
        raw.parse::<u64>()
            .map_err(|_| "must be a whole number".to_owned())
    }

    fn positive(raw: &str) -> Result<u64, String> {
        match whole(raw)? {
            0 => Err("must be greater than 0".into()),
            value => Ok(value),
        }
    }

    /// A whole number, 0 allowed.
    pub const COUNT: Parser<u64> = Parser {
        parse: whole,
        show: |v| v.to_string(),
    };
    /// A whole number greater than 0.
    pub const POSITIVE: Parser<u64> = Parser {
        parse: positive,
        show: |v| v.to_string(),
    };
    /// A whole number greater than 0, as a size or count in memory.
    pub const SIZE: Parser<usize> = Parser {
        parse: |raw| {
            positive(raw).and_then(|v| usize::try_from(v).map_err(|_| "is too large".into()))
        },
        show: |v| v.to_string(),
    };
    /// A whole number greater than 0 that fits 32 bits (attempts, failures).
    pub const ATTEMPTS: Parser<u32> = Parser {
        parse: |raw| {
            positive(raw).and_then(|v| u32::try_from(v).map_err(|_| "is too large".into()))
        },
        show: |v| v.to_string(),
    };
    /// A whole number, 0 allowed, as a size or count in memory.
    pub const COUNT_SIZE: Parser<usize> = Parser {
        parse: |raw| whole(raw).and_then(|v| usize::try_from(v).map_err(|_| "is too large".into())),
        show: |v| v.to_string(),
    };
    /// A whole number of milliseconds, 0 allowed.
    pub const MILLIS: Parser<Duration> = Parser {
        parse: |raw| whole(raw).map(Duration::from_millis),
        show: |v| v.as_millis().to_string(),
    };
    /// A whole number of milliseconds greater than 0.
    pub const POSITIVE_MILLIS: Parser<Duration> = Parser {
        parse: |raw| positive(raw).map(Duration::from_millis),
        show: |v| v.as_millis().to_string(),
    };
    /// A whole number of seconds greater than 0.
    pub const POSITIVE_SECONDS: Parser<Duration> = Parser {
        parse: |raw| positive(raw).map(Duration::from_secs),
        show: |v| v.as_secs().to_string(),
    };
    /// A whole number of seconds, 0 allowed.
    pub const SECONDS: Parser<Duration> = Parser {
        parse: |raw| whole(raw).map(Duration::from_secs),
        show: |v| v.as_secs().to_string(),
    };
    /// A fraction between 0 and 1.
    pub const FRACTION: Parser<f64> = Parser {
        parse: |raw| match raw.parse::<f64>() {
            Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
            _ => Err("must be a number from 0 to 1".into()),
        },
        show: |v| v.to_string(),
    };
    /// `true` or `false` (also `1`/`0`, `yes`/`no`).
    pub const BOOL: Parser<bool> = Parser {
        parse: |raw| match raw.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err("must be true or false".into()),
        },
        show: |v| v.to_string(),
    };
    /// Any text, trimmed.
    pub const TEXT: Parser<String> = Parser {
        parse: |raw| Ok(raw.to_owned()),
        show: Clone::clone,
    };
    /// A socket address, `IP:PORT`.
    pub const SOCKET_ADDR: Parser<SocketAddr> = Parser {
        parse: |raw| {
            raw.parse::<SocketAddr>()
                .map_err(|_| "must be an address like 127.0.0.1:9464".into())
        },
        show: |v| v.to_string(),
    };
    /// A comma-separated list; blanks are dropped.
    pub const LIST: Parser<Vec<String>> = Parser {
        parse: |raw| {
            Ok(raw
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(str::to_owned)
                .collect())
        },
        show: |v| v.join(","),
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacted_values_never_show_in_debug() {
        let url = super::Redacted::new("redis://api:hunter2hunter2@h:6379/0".to_owned());
        let debug = format!("{url:?} {:?}", Some(url.clone()));
        assert!(!debug.contains("hunter2"), "{debug}");
        assert_eq!(url.expose(), "redis://api:hunter2hunter2@h:6379/0");
    }

    use super::*;

    const PORT: Setting<u64> =
        Setting::new("PORT", parse::POSITIVE, Fallback::Value(|| 9464), "A port.");
    const DELAY: Setting<Duration> = Setting::new(
        "DELAY_MS",
        parse::MILLIS,
        Fallback::Derived("PORT/2"),
        "A delay.",
    );
    const URL: Setting<String> = Setting::new("URL", parse::TEXT, Fallback::Unset, "Where.");
    const KEY: Setting<u64> = Setting::secret("KEY", parse::POSITIVE, Fallback::Unset, "A key.");

    #[test]
    fn defaults_are_typed_and_documented_once() {
        let lookup = fixed_lookup(&[]);
        let mut env = Env::new(&lookup);
        assert_eq!(env.get(&PORT), 9464);
        assert_eq!(
            env.or(&DELAY, Duration::from_millis(7)),
            Duration::from_millis(7)
        );
        assert_eq!(env.optional(&URL), None);
        assert!(env.finish(()).is_ok());
        assert_eq!(PORT.default_text(), "9464");
        assert_eq!(DELAY.default_text(), "PORT/2");
        assert_eq!(URL.default_text(), "");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let lookup = fixed_lookup(&[("PORT", "0"), ("DELAY_MS", "soon")]);
        let mut env = Env::new(&lookup);
        assert_eq!(
            env.get(&PORT),
            9464,
            "a bad value falls back so parsing goes on"
        );
        env.or(&DELAY, Duration::ZERO);
        env.required(&URL, "by this test");
        let err = env.finish(()).unwrap_err();
        assert_eq!(err.problems.len(), 3, "{err}");
        assert!(
            err.problems[0].starts_with("PORT: must be greater than 0"),
            "{err}"
        );
        assert!(
            err.problems[1].starts_with("DELAY_MS: must be a whole number"),
            "{err}"
        );
        assert_eq!(err.problems[2], "URL: is required by this test");
    }

    #[test]
    fn secret_values_are_never_echoed() {
        let lookup = fixed_lookup(&[("KEY", "hunter2"), ("PORT", "hunter3")]);
        let mut env = Env::new(&lookup);
        env.optional(&KEY);
        env.get(&PORT);
        let err = env.finish(()).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.contains("hunter3"), "a plain value is echoed: {err}");
    }

    #[test]
    fn empty_values_count_as_unset() {
        let lookup = fixed_lookup(&[("URL", "")]);
        let mut env = Env::new(&lookup);
        assert_eq!(env.optional(&URL), None);
        assert_eq!(env.raw("URL"), None);
        assert!(!env.has_problems());
    }

    #[test]
    fn an_empty_template_is_a_value_where_the_setting_says_so() {
        const SUBSCRIBE: Setting<String> = Setting::new(
            "SUBSCRIBE",
            parse::TEXT,
            Fallback::Value(|| "hello".to_owned()),
            "Sent after connecting.",
        )
        .with_empty_as_a_value();
        let empty = fixed_lookup(&[("SUBSCRIBE", "")]);
        assert_eq!(Env::new(&empty).get(&SUBSCRIBE), "");
        let unset = fixed_lookup(&[]);
        assert_eq!(Env::new(&unset).get(&SUBSCRIBE), "hello");
    }
}
