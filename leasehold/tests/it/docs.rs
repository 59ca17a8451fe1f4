//! The contract in `docs/` is checked against the code it describes: every
//! variable with its default and secrecy, every metric name, and no pointer to
//! material outside the repository.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use leasehold_platform::settings::Documented;
use leasehold_testkit::repo_root;

/// Every variable every component reads, from each one's own definitions.
fn every_setting() -> Vec<&'static dyn Documented> {
    [
        leasehold_control::settings::ALL,
        leasehold_stream::settings::ALL,
        leasehold_telemetry::settings::ALL,
        leasehold_sidecar::settings::ALL,
        leasehold_dashboard::settings::ALL,
        leasehold_pool::settings::ALL,
        leasehold_broker::settings::ALL,
        leasehold_platform::logging::ALL,
    ]
    .concat()
}

/// Rows `| `NAME` | default | rest… |` of every table in a Markdown file.
fn table_rows(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().strip_prefix('|')?.split('|').collect();
            let name = cells.first()?.trim().strip_prefix('`')?.strip_suffix('`')?;
            Some((
                name.to_owned(),
                cells.get(1)?.trim().to_owned(),
                cells.get(2..)?.join("|"),
            ))
        })
        .collect()
}

/// Every `pub const NAME: Setting<…>` / `External` in the workspace's sources.
fn declared_settings(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir)
        .expect("readable source tree")
        .flatten()
    {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != ".git" && name != "tests" && name != "benches" {
                declared_settings(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for line in text.lines() {
                let declared = line
                    .strip_prefix("pub const ")
                    .and_then(|rest| rest.split_once(':'))
                    .filter(|(_, ty)| {
                        ty.trim_start().starts_with("Setting<")
                            || ty.trim_start().starts_with("External")
                    });
                if let Some((name, _)) = declared {
                    out.insert(name.trim().to_owned());
                }
            }
        }
    }
}

#[test]
fn every_variable_is_listed_once_where_components_read_it() {
    let mut declared = BTreeSet::new();
    declared_settings(&repo_root(), &mut declared);
    let listed: BTreeSet<String> = every_setting()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    let unlisted: Vec<_> = declared.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "declared but in no component's ALL (so neither documented nor checked): {unlisted:?}"
    );
    assert_eq!(
        listed.len(),
        every_setting().len(),
        "a variable is in two lists"
    );
}

/// The row `docs/configuration.md` has for `setting`: its default and its
/// meaning are the code's (`Setting::doc` is the one text).
fn configuration_row(setting: &dyn Documented) -> String {
    let default = match setting.default_text() {
        text if text.is_empty() => "—".to_owned(),
        text => format!("`{text}`"),
    };
    format!("| `{}` | {default} | {} |", setting.name(), setting.doc())
}

/// `docs/configuration.md` with every setting's row written from the code:
/// rows stay where they are (the sections and the prose between the tables
/// are the doc's); a setting with no row yet goes at the end of the table
/// holding most of its component's settings. Also the names with a row
/// that nothing reads.
fn regenerated_configuration(doc: &str) -> (String, Vec<String>) {
    let components = [
        leasehold_control::settings::ALL,
        leasehold_stream::settings::ALL,
        leasehold_telemetry::settings::ALL,
        leasehold_sidecar::settings::ALL,
        leasehold_dashboard::settings::ALL,
        leasehold_pool::settings::ALL,
        leasehold_broker::settings::ALL,
        leasehold_platform::logging::ALL,
    ];
    let by_name: BTreeMap<&str, (usize, &dyn Documented)> = components
        .iter()
        .enumerate()
        .flat_map(|(component, all)| all.iter().map(move |s| (s.name(), (component, *s))))
        .collect();
    let mut lines: Vec<String> = doc.lines().map(str::to_owned).collect();
    let mut seen = BTreeSet::new();
    let mut unread = Vec::new();
    // The last row of each table and the components of its settings.
    let mut tables: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut in_table = false;
    for (index, line) in lines.iter_mut().enumerate() {
        let table_line = line.trim_start().starts_with('|');
        if table_line && !in_table {
            tables.push((index, Vec::new()));
        }
        in_table = table_line;
        let Some((name, _, _)) = table_rows(line).pop() else {
            continue;
        };
        let table = tables.last_mut().unwrap();
        table.0 = index;
        match by_name.get(name.as_str()) {
            Some((component, setting)) => {
                *line = configuration_row(*setting);
                table.1.push(*component);
                seen.insert(name);
            }
            None => unread.push(name),
        }
    }
    let mut inserts: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (name, (component, setting)) in &by_name {
        if seen.contains(*name) {
            continue;
        }
        let home = tables
            .iter()
            .max_by_key(|(_, components)| components.iter().filter(|c| *c == component).count())
            .map_or(lines.len().saturating_sub(1), |(last, _)| *last);
        inserts
            .entry(home)
            .or_default()
            .push(configuration_row(*setting));
    }
    for (after, rows) in inserts.into_iter().rev() {
        lines.splice(after + 1..after + 1, rows);
    }
    (lines.join("\n") + "\n", unread)
}

/// The tables of `docs/configuration.md` are the code's settings: change a
/// setting's doc or default, or add one, and this fails until the doc is
/// rewritten with `UPDATE_DOCS=1 cargo test -p leasehold --test it docs::`.
#[test]
fn the_configuration_doc_matches_the_code() {
    let path = repo_root().join("docs/configuration.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let mut names = BTreeSet::new();
    for (name, _, _) in table_rows(&doc) {
        assert!(
            names.insert(name.clone()),
            "{name} appears twice in docs/configuration.md"
        );
    }
    let (regenerated, unread) = regenerated_configuration(&doc);
    assert!(
        unread.is_empty(),
        "docs/configuration.md lists what nothing reads: {unread:?}"
    );
    for setting in every_setting() {
        assert_eq!(
            setting.secret(),
            setting.doc().contains("never printed"),
            "{}: its doc must say \"never printed\" exactly when the code treats it as a secret",
            setting.name()
        );
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, regenerated).unwrap();
        return;
    }
    let stale: Vec<(&str, &str)> = doc
        .lines()
        .zip(regenerated.lines())
        .filter(|(was, is)| was != is)
        .collect();
    assert!(
        stale.is_empty() && doc == regenerated,
        "docs/configuration.md is not what the settings say; rewrite it with \
         `UPDATE_DOCS=1 cargo test -p leasehold --test it docs::`. First difference (doc, code): {:#?}",
        stale.first()
    );
}

#[test]
fn the_readme_points_to_the_configuration_doc() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    assert!(readme.contains("docs/configuration.md"));
}

#[test]
fn the_metrics_doc_matches_the_code() {
    let doc = std::fs::read_to_string(repo_root().join("docs/metrics.md")).unwrap();
    let documented: BTreeSet<String> = table_rows(&doc)
        .into_iter()
        .map(|(name, _, _)| name)
        .filter(|name| name.starts_with("leasehold_"))
        .collect();
    // The sidecar's, and the credential sealer's own (it runs without one).
    let exported: BTreeSet<String> = leasehold_sidecar::metrics::ALL
        .iter()
        .chain(leasehold_broker::sealer::METRICS)
        .map(|name| (*name).to_owned())
        .collect();
    assert_eq!(
        documented.difference(&exported).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "documented but not exported"
    );
    assert_eq!(
        exported.difference(&documented).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "exported but not documented"
    );
    // The list itself must hold every name the metric module spells.
    let module = std::fs::read_to_string(repo_root().join("sidecar/src/metrics.rs")).unwrap();
    let spelled = module
        .lines()
        .filter(|line| line.starts_with("pub const ") && line.contains(": &str = \"leasehold_"))
        .count();
    assert_eq!(
        spelled,
        leasehold_sidecar::metrics::ALL.len(),
        "sidecar::metrics::ALL misses a name"
    );
}

#[test]
fn no_tracked_file_points_outside_the_repository() {
    let Ok(output) = std::process::Command::new("git")
        // Spelled in pieces so this file does not match itself.
        .args([
            "grep",
            "-n",
            "-e",
            concat!("\\.\\.", "/shared"),
            "-e",
            concat!("seed", "s/"),
        ])
        .current_dir(repo_root())
        .output()
    else {
        panic!("git is needed to list tracked files");
    };
    let found = String::from_utf8_lossy(&output.stdout);
    assert!(
        found.trim().is_empty(),
        "tracked files point to material a clone does not have:\n{found}"
    );
}

/// Every long flag of `leasehold` and its subcommands (`path`), from their
/// `--help`: the binary's surface as a user meets it.
fn long_flags(path: &[String], out: &mut Vec<(String, String)>) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(path)
        .arg("--help")
        .output()
        .expect("leasehold runs");
    let help = String::from_utf8(output.stdout).expect("help is UTF-8");
    let mut section = "";
    let mut subcommands = Vec::new();
    for line in help.lines() {
        let Some(item) = line.strip_prefix("  ") else {
            section = line;
            continue;
        };
        // The name or flag spec, before the gap that starts its description.
        let head = item.trim_start().split("  ").next().unwrap_or_default();
        match section {
            "Commands:" if head != "help" => subcommands.push(head.to_owned()),
            "Options:" => {
                let long = head.split([' ', ',']).find(|word| word.starts_with("--"));
                if let Some(long) = long
                    && long != "--help"
                    && long != "--version"
                {
                    out.push((format!("leasehold {}", path.join(" ")), long.to_owned()));
                }
            }
            _ => {}
        }
    }
    for sub in subcommands {
        let mut path = path.to_vec();
        path.push(sub);
        long_flags(&path, out);
    }
}

#[test]
fn every_flag_is_in_the_readme() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let section = readme
        .split("## Command-line flags")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("README has a Command-line flags section");
    let mut flags = Vec::new();
    long_flags(&[], &mut flags);
    assert!(flags.len() > 20, "{flags:?}");
    let missing: Vec<_> = flags
        .iter()
        .filter(|(_, flag)| !section.contains(&format!("`{flag}")))
        .collect();
    assert!(
        missing.is_empty(),
        "flags missing from the README: {missing:?}"
    );
}

/// A crate's top-level modules: `mod x;` in any visibility, and modules
/// re-exported whole (`pub use other::x;`).
fn declared_modules(lib: &str) -> BTreeSet<String> {
    lib.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "))
                .or_else(|| {
                    line.strip_prefix("pub use ")
                        .filter(|path| path.contains("::") && !path.contains('{'))
                        .and_then(|path| path.rsplit("::").next())
                        .filter(|name| {
                            name.chars()
                                .all(|c| c.is_ascii_lowercase() || c == '_' || c == ';')
                        })
                })?;
            let name = rest.strip_suffix(';')?;
            (name != "tests").then(|| name.to_owned())
        })
        .collect()
}

/// The modules a crate's module map names: the head (before `:` or ` (`) of
/// each `//! - [`x`]…` or `//! - `x`…` bullet of its crate documentation,
/// which may name several (`[`memory`], [`redis`]: the two sinks`).
fn mapped_modules(lib: &str) -> BTreeSet<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! - "))
        .filter(|bullet| bullet.starts_with("[`") || bullet.starts_with('`'))
        .flat_map(|bullet| {
            let head = bullet.split(':').next().unwrap_or_default();
            let head = head.split(" (").next().unwrap_or_default();
            head.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// ARCHITECTURE.md sends a newcomer to each crate's module map: the map must
/// list every module the crate has, and nothing it no longer has.
#[test]
fn every_crate_module_map_matches_its_modules() {
    let root = repo_root();
    let mut libs: Vec<_> = [
        "control",
        "platform",
        "telemetry",
        "sidecar",
        "dashboard",
        "devcluster",
        "testkit",
    ]
    .iter()
    .map(|dir| root.join(dir).join("src/lib.rs"))
    .collect();
    for entry in std::fs::read_dir(root.join("worker")).unwrap() {
        let lib = entry.unwrap().path().join("src/lib.rs");
        if lib.exists() {
            libs.push(lib);
        }
    }
    assert!(libs.len() >= 12, "every library crate is checked");
    let mut problems = Vec::new();
    for lib in libs {
        let text = std::fs::read_to_string(&lib).unwrap();
        let declared = declared_modules(&text);
        let mapped = mapped_modules(&text);
        let unmapped: Vec<_> = declared.difference(&mapped).collect();
        let stale: Vec<_> = mapped.difference(&declared).collect();
        if !unmapped.is_empty() || !stale.is_empty() {
            problems.push(format!(
                "{}: not in the module map {unmapped:?}; in the map but not a module {stale:?}",
                lib.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
