//! The README's configuration reference is checked against the one module that
//! defines the variables, so neither can drift from the other.

use leasehold_control::config;

#[test]
fn readme_documents_every_environment_variable() {
    let readme =
        std::fs::read_to_string(leasehold_control::testing::repo_root().join("README.md")).unwrap();
    let table_rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `")).collect();
    for var in config::ALL {
        let row = table_rows
            .iter()
            .find(|row| row.starts_with(&format!("| `{}` |", var.name)))
            .unwrap_or_else(|| panic!("README has no configuration row for {}", var.name));
        if !var.default.is_empty() {
            assert!(
                row.contains(var.default),
                "README row for {} lacks its default {:?}",
                var.name,
                var.default
            );
        }
    }
}
