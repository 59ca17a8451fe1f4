#!/usr/bin/env python3
"""Every compile-time input of the image build is in the Docker build context.

The image runs `cargo build --release --locked -p leasehold` on what `COPY . .`
brought in, so a file the compiler reads that `.dockerignore` leaves out breaks
the build (issue 42: the runbooks `include_str!` reads were excluded). This
computes the context with `.dockerignore`'s real semantics, docker-py's
`docker.utils.build.exclude_paths` (moby's pattern matcher: Go filepath.Match
plus `**`, last matching rule wins, `!` re-includes), and the inputs from the
workspace itself:

  - the root Cargo.toml, Cargo.lock, rust-toolchain.toml, `.cargo/config*`;
  - each workspace member's (and path dependency's) Cargo.toml, every file
    under its src/ (conservative: `#[cfg(test)]` modules count), build.rs and
    what it reads (`rerun-if-changed`, literal file reads), the lib/bin paths
    it names, and the file of every declared `[[bench]]`/`[[test]]`/
    `[[example]]`/`[[bin]]` (cargo refuses a manifest whose declared target's
    file is missing, even when that target is not built);
  - every `include_str!`/`include_bytes!`/`include!` in those .rs files (path
    relative to the .rs file, or `concat!(env!("CARGO_MANIFEST_DIR"), "...")`;
    any other form is reported, so a new form cannot slip through);
  - `#[path = "..."]` module files;
  - askama: `askama.toml` (or `#[template(config = ...)]`) and every file in
    its template dirs (default `templates/`); each `#[template(path)]` must be
    in one of them;
  - the sources of the Dockerfile's COPY/ADD without `--from` (and bind mounts).

Test-only inputs (tests/, benches/ bodies, examples) are not compiled by the
image build and are not required, except for the declared target files above.

    python3 scripts/check_build_context.py              # the check
    python3 scripts/check_build_context.py --self-test  # proves it can fail
    python3 scripts/check_build_context.py --compile    # + cargo check of a copy of the context

Needs the `docker` package (PyPI); scripts/check_outside_tools.sh installs it
into the venv. Exit status 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

try:
    from docker.utils.build import exclude_paths
except ImportError:  # pragma: no cover - reported to the user
    # Run by a Python without it (`python3 scripts/...`): the leasehold venv's, if it has it.
    _venv_python = Path(os.environ.get("LEASEHOLD_CACHE", Path.home() / ".cache/leasehold")) / "venv/bin/python"
    if _venv_python.exists() and Path(sys.prefix).resolve() != _venv_python.parent.parent.resolve():
        os.execv(str(_venv_python), [str(_venv_python), *sys.argv])
    sys.exit(
        "error: the Python package `docker` is needed (pip install docker); "
        "scripts/check_outside_tools.sh installs it into the leasehold venv"
    )

REPO = Path(__file__).resolve().parent.parent
INCLUDE_RE = re.compile(r"\binclude(_str|_bytes)?!\s*\(")
PATH_ATTR_RE = re.compile(r'#\[\s*path\s*=\s*"([^"]+)"\s*\]')
TEMPLATE_ATTR_RE = re.compile(r"#\[\s*template\s*\((.*?)\)\s*\]", re.S)
STRING_RE = r'"((?:[^"\\]|\\.)*)"'


# --- the context ---------------------------------------------------------------
def read_dockerignore(root: Path) -> list[str]:
    """The patterns exactly as docker-py's APIClient.build reads them."""
    path = root / ".dockerignore"
    if not path.exists():
        return []
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line != "" and line[0] != "#"]


def context_files(root: Path, patterns: list[str]) -> set[str]:
    """Regular files (and symlinks) the build context holds, relative to root."""
    # exclude_paths appends `!Dockerfile` to the list it is given: pass a copy.
    paths = exclude_paths(str(root), list(patterns), dockerfile="Dockerfile")
    return {p for p in paths if not (root / p).is_dir() or (root / p).is_symlink()}


# --- the inputs -----------------------------------------------------------------
class Inputs:
    """Compile-time inputs: relative path -> what needs it (first reason wins)."""

    def __init__(self, root: Path):
        self.root = root
        self.needed: dict[str, str] = {}
        self.problems: list[str] = []  # inputs that cannot be resolved at all

    def rel(self, path: Path) -> str | None:
        try:
            return os.path.relpath(os.path.normpath(path), self.root)
        except ValueError:
            return None

    def add(self, path: Path, why: str) -> None:
        rel = self.rel(path)
        if rel is None or rel.startswith(".."):
            self.problems.append(f"{path}: outside the repository, needed by {why}")
            return
        self.needed.setdefault(rel, why)

    def add_tree(self, directory: Path, why: str) -> None:
        for dirpath, _dirs, files in os.walk(directory):
            for name in files:
                self.add(Path(dirpath) / name, why)


def strip_line_comments(text: str) -> str:
    """Blank out lines that are comments (`//`, `///`, `//!`), keeping line numbers."""
    return "\n".join("" if line.lstrip().startswith("//") else line for line in text.split("\n"))


def balanced_argument(text: str, start: int) -> str | None:
    """The text between the `(` before `start` and its matching `)`."""
    depth, i, in_string = 1, start, False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def resolve_include(arg: str, rs_file: Path, manifest_dir: Path) -> Path | str | None:
    """The file an include macro's argument names; None for generated (OUT_DIR)
    files; a string explaining why when the form is not understood."""
    arg = " ".join(arg.split()).rstrip(",").strip()
    if 'env!("OUT_DIR")' in arg.replace(" ", ""):
        return None  # written by build.rs into the target dir, not a source file
    literal = re.fullmatch(STRING_RE, arg)
    if literal:
        return rs_file.parent / literal.group(1)
    raw = re.fullmatch(r'r(#*)"(.*)"\1', arg)
    if raw:
        return rs_file.parent / raw.group(2)
    concat = re.fullmatch(r"concat!\s*\(\s*env!\s*\(\s*\"CARGO_MANIFEST_DIR\"\s*\)\s*,\s*(.*)\)", arg)
    if concat:
        parts = re.findall(STRING_RE, concat.group(1))
        rest = re.sub(STRING_RE, "", concat.group(1)).replace(",", "").strip()
        if parts and not rest:
            return Path(str(manifest_dir) + "".join(parts))
    return f"an include form this check does not understand: {arg!r}"


def scan_rust_file(inputs: Inputs, rs: Path, manifest_dir: Path, seen: set[Path]) -> None:
    """Adds what one compiled .rs file reads at compile time (and follows #[path])."""
    if rs in seen or not rs.is_file():
        return
    seen.add(rs)
    rel = inputs.rel(rs)
    text = strip_line_comments(rs.read_text(errors="replace"))
    for m in INCLUDE_RE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        where = f"{rel}:{line} ({m.group(0).rstrip('( ')})"
        arg = balanced_argument(text, m.end())
        target = None if arg is None else resolve_include(arg, rs, manifest_dir)
        if arg is None or isinstance(target, str):
            inputs.problems.append(f"{rel}:{line}: {target or 'unbalanced include macro'}")
        elif target is not None:
            inputs.add(target, where)
            if m.group(1) is None and target.suffix == ".rs":  # include!() of Rust code
                scan_rust_file(inputs, target, manifest_dir, seen)
    for m in PATH_ATTR_RE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        target = rs.parent / m.group(1)
        inputs.add(target, f"{rel}:{line} (#[path])")
        scan_rust_file(inputs, target, manifest_dir, seen)


def template_attrs(text: str) -> list[dict[str, str]]:
    out = []
    for m in TEMPLATE_ATTR_RE.finditer(text):
        out.append(dict(re.findall(r"(\w+)\s*=\s*" + STRING_RE, m.group(1))))
    return out


def manifest_targets(manifest: dict, crate: Path) -> list[tuple[Path, str]]:
    """Files cargo needs for the targets a manifest names (lib, bins, declared
    benches/tests/examples: cargo stops on a declared target without a file)."""
    out: list[tuple[Path, str]] = []
    lib = manifest.get("lib")
    if isinstance(lib, dict) and "path" in lib:
        out.append((crate / lib["path"], "[lib] path"))
    defaults = {"bin": "src/bin", "bench": "benches", "test": "tests", "example": "examples"}
    for kind, folder in defaults.items():
        for target in manifest.get(kind, []):
            name = target.get("name", "?")
            why = f"[[{kind}]] {name} (cargo refuses a declared target whose file is missing)"
            if "path" in target:
                out.append((crate / target["path"], why))
                continue
            candidates = [crate / folder / f"{name}.rs", crate / folder / name / "main.rs"]
            if kind == "bin":
                candidates.insert(0, crate / "src" / "main.rs")
            found = next((c for c in candidates if c.exists()), candidates[0])
            out.append((found, why))
    return out


def build_script_reads(inputs: Inputs, build_rs: Path, crate: Path) -> None:
    text = strip_line_comments(build_rs.read_text(errors="replace"))
    rel = inputs.rel(build_rs)
    for m in re.finditer(r"rerun-if-changed=([^\"\\}{]+)", text):
        inputs.add(crate / m.group(1).strip(), f"{rel} (rerun-if-changed)")
    reads = r"(?:read_to_string|read|File::open|read_dir|copy)\s*\(\s*" + STRING_RE
    for m in re.finditer(reads, text):
        target = crate / m.group(1)
        if target.is_dir():
            inputs.add_tree(target, f"{rel} (reads {m.group(1)})")
        else:
            inputs.add(target, f"{rel} (reads {m.group(1)})")


def dependency_paths(manifest: dict) -> list[str]:
    out = []
    tables = [manifest.get("workspace", {}).get("dependencies", {})]
    for key in ("dependencies", "dev-dependencies", "build-dependencies"):
        tables.append(manifest.get(key, {}))
    for target in manifest.get("target", {}).values():
        for key in ("dependencies", "build-dependencies"):
            tables.append(target.get(key, {}))
    for table in tables:
        for spec in table.values():
            if isinstance(spec, dict) and "path" in spec:
                out.append(spec["path"])
    return out


def workspace_inputs(root: Path) -> Inputs:
    inputs = Inputs(root)
    root_manifest_path = root / "Cargo.toml"
    root_manifest = tomllib.loads(root_manifest_path.read_text())
    inputs.add(root_manifest_path, "the workspace")
    inputs.add(root / "Cargo.lock", "cargo build --locked")
    for name in ("rust-toolchain.toml", "rust-toolchain"):
        if (root / name).exists():
            inputs.add(root / name, "rustup (the toolchain the build uses)")
    for name in (".cargo/config.toml", ".cargo/config"):
        if (root / name).exists():
            inputs.add(root / name, "cargo configuration")

    ws = root_manifest.get("workspace", {})
    excluded = {os.path.normpath(root / e) for e in ws.get("exclude", [])}
    crates: list[Path] = []
    for member in ws.get("members", []):
        for match in sorted(glob.glob(str(root / member))) or [str(root / member)]:
            if os.path.normpath(match) not in excluded:
                crates.append(Path(match))
    if "package" in root_manifest:
        crates.append(root)

    done: set[Path] = set()
    seen_rs: set[Path] = set()
    while crates:
        crate = Path(os.path.normpath(crates.pop(0)))
        if crate in done:
            continue
        done.add(crate)
        manifest_path = crate / "Cargo.toml"
        crate_rel = inputs.rel(crate)
        if not manifest_path.exists():
            inputs.add(manifest_path, f"workspace member {crate_rel}")
            continue
        manifest = tomllib.loads(manifest_path.read_text())
        inputs.add(manifest_path, f"workspace member {crate_rel}")
        for dep in dependency_paths(manifest):
            crates.append(crate / dep)
        for name in (".cargo/config.toml", ".cargo/config"):
            if crate != root and (crate / name).exists():
                inputs.add(crate / name, "cargo configuration")

        # Compiled Rust: everything under src/, the build script, named target paths.
        rust_files: list[Path] = []
        if (crate / "src").is_dir():
            for dirpath, _dirs, files in os.walk(crate / "src"):
                for name in files:
                    path = Path(dirpath) / name
                    inputs.add(path, f"{crate_rel}/src (compiled)")
                    if name.endswith(".rs"):
                        rust_files.append(path)
        package = manifest.get("package", {})
        build = package.get("build", True)
        build_rs = crate / build if isinstance(build, str) else crate / "build.rs"
        if build is not False and build_rs.exists():
            inputs.add(build_rs, f"{crate_rel} build script")
            rust_files.append(build_rs)
            build_script_reads(inputs, build_rs, crate)
        for path, why in manifest_targets(manifest, crate):
            inputs.add(path, f"{crate_rel}/Cargo.toml {why}")
            if why in ("[lib] path",) or why.startswith("[[bin]]"):
                rust_files.append(path)

        for rs in rust_files:
            scan_rust_file(inputs, rs, crate, seen_rs)

        # askama: its config file and template directories.
        deps = dict(manifest.get("dependencies", {}))
        if any(name == "askama" or (isinstance(s, dict) and s.get("package") == "askama") for name, s in deps.items()):
            attrs = []
            for rs in rust_files:
                attrs += [(rs, a) for a in template_attrs(rs.read_text(errors="replace"))]
            configs = {a.get("config", "askama.toml") for _rs, a in attrs} or {"askama.toml"}
            for config_name in sorted(configs):
                config_path = crate / config_name
                dirs = [crate / "templates"]
                if config_path.exists():
                    inputs.add(config_path, f"askama ({crate_rel})")
                    general = tomllib.loads(config_path.read_text()).get("general", {})
                    if "dirs" in general:
                        dirs = [Path(p) for d in general["dirs"] for p in (glob.glob(str(crate / d)) or [crate / d])]
                for d in dirs:
                    inputs.add_tree(d, f"askama templates ({crate_rel}, {inputs.rel(d)})")
                for rs, attr in attrs:
                    if attr.get("config", "askama.toml") != config_name or "path" not in attr:
                        continue
                    if not any((d / attr["path"]).is_file() for d in dirs):
                        inputs.problems.append(
                            f"{inputs.rel(rs)}: #[template(path = {attr['path']!r})] is in none of "
                            f"{', '.join(str(inputs.rel(d)) for d in dirs)}"
                        )

    dockerfile_inputs(inputs, root)
    return inputs


def dockerfile_instructions(text: str) -> list[str]:
    out, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#") and current:
            continue  # comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
        else:
            out.append(current + stripped)
            current = ""
    if current:
        out.append(current)
    return out


def dockerfile_inputs(inputs: Inputs, root: Path) -> None:
    dockerfile = root / "Dockerfile"
    if not dockerfile.exists():
        return
    for instruction in dockerfile_instructions(dockerfile.read_text()):
        try:
            words = shlex.split(instruction, posix=True)
        except ValueError:
            words = instruction.split()
        if not words:
            continue
        keyword = words[0].upper()
        sources: list[str] = []
        if keyword in ("COPY", "ADD"):
            args = words[1:]
            if any(a.startswith("--from") for a in args):
                continue
            args = [a for a in args if not a.startswith("--")]
            sources = args[:-1]
        elif keyword == "RUN":
            for flag in words[1:]:
                if flag.startswith("--mount=") and "type=bind" in flag and "from=" not in flag:
                    opts = dict(o.split("=", 1) for o in flag[len("--mount="):].split(",") if "=" in o)
                    sources.append(opts.get("source", opts.get("src", ".")))
        for src in sources:
            if "://" in src:
                continue
            why = f"Dockerfile {keyword} {src}"
            if src.strip("./") == "":
                continue  # the whole context
            matches = glob.glob(str(root / src))
            if not matches:
                inputs.problems.append(f"{src}: matches no file, needed by {why}")
            for match in matches:
                if os.path.isdir(match):
                    inputs.add_tree(Path(match), why)
                else:
                    inputs.add(Path(match), why)


# --- the check -------------------------------------------------------------------
def check(root: Path, patterns: list[str]) -> tuple[list[str], int, int]:
    """(problems, files in context, inputs checked)."""
    context = context_files(root, patterns)
    inputs = workspace_inputs(root)
    problems = list(inputs.problems)
    for rel, why in sorted(inputs.needed.items()):
        if not (root / rel).exists():
            problems.append(f"{rel}: does not exist, needed by {why}")
        elif rel not in context:
            problems.append(f"{rel}: not in the Docker build context (.dockerignore), needed by {why}")
    return problems, len(context), len(inputs.needed)


def self_test(root: Path) -> int:
    """Breaks the rules (and a synthetic crate) in known ways; each must be reported."""
    real = read_dockerignore(root)
    failures: list[str] = []

    def expect(name: str, patterns: list[str], wanted: list[str], where: Path = root) -> None:
        problems, _, _ = check(where, patterns)
        for want in wanted:
            if not any(re.search(want, p) for p in problems):
                failures.append(f"{name}: no problem matching {want!r}; got {problems[:5]}")

    # The rules before issue 42's fix: `alerts` excluded, nothing re-included.
    pre_fix = [p for p in real if not p.lstrip("!").startswith("alerts/")]
    if "alerts" not in pre_fix:
        pre_fix.append("alerts")
    expect("pre-fix .dockerignore", pre_fix,
           [r"^alerts/runbooks/\w+\.md: not in the Docker build context.*dashboard/src/web/views/stream\.rs:\d+ \(include_str!\)"])
    expect("Cargo.lock excluded", real + ["Cargo.lock"], [r"^Cargo\.lock: not in the Docker build context.*--locked"])
    expect("every *.md excluded", real + ["**/*.md"], [r"^alerts/runbooks/LeaseholdLeaseLost\.md: not in"])
    expect("templates excluded", real + ["dashboard/templates"], [r"^dashboard/templates/stream\.html: not in.*askama"])
    expect("static excluded", real + ["dashboard/static/*.js"], [r"^dashboard/static/dashboard\.js: not in.*router\.rs:\d+"])
    expect("benches excluded", real + ["*/benches"], [r"^dashboard/benches/render\.rs: not in.*\[\[bench\]\] render"])
    expect("a member excluded", real + ["worker/feed"], [r"^worker/feed/Cargo\.toml: not in.*workspace member"])
    expect("toolchain excluded", real + ["rust-toolchain.toml"], [r"^rust-toolchain\.toml: not in"])

    # Forms the workspace does not use (yet): a synthetic workspace.
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "a/src/m").mkdir(parents=True)
        (t / "a/data").mkdir()
        (t / "a/templates").mkdir()
        (t / "Cargo.toml").write_text('[workspace]\nmembers = ["a"]\n')
        (t / "Cargo.lock").write_text("version = 4\n")
        (t / "a/Cargo.toml").write_text(
            '[package]\nname = "a"\nversion = "0.1.0"\n[dependencies]\naskama = "0.16"\n')
        (t / "a/askama.toml").write_text('[general]\ndirs = ["views"]\n')
        (t / "a/views").mkdir()
        (t / "a/views/page.html").write_text("x")
        (t / "a/build.rs").write_text('fn main() { println!("cargo::rerun-if-changed=data/schema.txt"); }\n')
        (t / "a/data/schema.txt").write_text("x")
        (t / "a/data/blob.bin").write_text("x")
        (t / "a/data/gen.rs").write_text("pub const X: u8 = 1;\n")
        (t / "a/src/lib.rs").write_text(
            'const B: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/data/blob.bin"));\n'
            'include!(concat!(env!("OUT_DIR"), "/generated.rs"));\n'
            '// include_str!("commented/out.txt")\n'
            '#[path = "../data/gen.rs"]\nmod generated;\n'
            '#[derive(askama::Template)]\n#[template(path = "page.html")]\nstruct P;\n'
            'const W: &str = include_str!(some_macro!());\n')
        synthetic = ["a/data", "a/views", "a/askama.toml", "a/build.rs"]
        expect("synthetic forms", synthetic, [
            r"^a/data/blob\.bin: not in.*a/src/lib\.rs:1 \(include_bytes!\)",
            r"^a/data/gen\.rs: not in.*#\[path\]",
            r"^a/views/page\.html: not in.*askama",
            r"^a/askama\.toml: not in.*askama",
            r"^a/data/schema\.txt: not in.*rerun-if-changed",
            r"^a/build\.rs: not in.*build script",
            r"^a/src/lib\.rs:\d+: an include form this check does not understand",
        ], where=t)
        problems, _, _ = check(t, synthetic)
        for unwanted in (r"OUT_DIR|generated\.rs: ", r"commented/out\.txt"):
            if any(re.search(unwanted, p) for p in problems):
                failures.append(f"synthetic forms: reported {unwanted!r}, which is no input")

    # And the real rules pass.
    problems, _, _ = check(root, real)
    if problems:
        failures.append(f"the real .dockerignore: {problems[:5]}")
    for failure in failures:
        print(f"self-test FAILED: {failure}", file=sys.stderr)
    if failures:
        return 1
    print("build context self-test: 9 broken rule sets each reported (pre-fix rules name the runbooks; "
          "an excluded Cargo.lock is named); the real rules pass")
    return 0


def compile_context(root: Path, patterns: list[str]) -> int:
    """Copies exactly the context into a fresh directory and runs
    `cargo check --locked --offline -p leasehold` there. The directory is always
    the same one (under the leasehold cache) and the copies keep their mtimes,
    so a second run with unchanged sources reuses the workspace crates too."""
    context = context_files(root, patterns)
    cache = Path(os.environ.get("LEASEHOLD_CACHE", Path.home() / ".cache/leasehold"))
    env = dict(os.environ)
    env.setdefault("CARGO_TARGET_DIR", str(cache / "target"))
    copy = cache / "build-context"
    shutil.rmtree(copy, ignore_errors=True)
    for rel in sorted(context):
        dest = copy / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest, follow_symlinks=False)
    start = time.monotonic()
    cmd = ["cargo", "check", "--locked", "--offline", "-p", "leasehold"]
    result = subprocess.run(cmd, cwd=copy, env=env)
    took = time.monotonic() - start
    if result.returncode != 0:
        print(f"error: `{' '.join(cmd)}` failed in {copy}, a copy of the build context ({took:.0f} s)",
              file=sys.stderr)
        return 1
    shutil.rmtree(copy, ignore_errors=True)
    print(f"build context compiles: `{' '.join(cmd)}` on a copy of its {len(context)} files passed in {took:.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true", help="prove the check reports broken rules")
    parser.add_argument("--compile", action="store_true",
                        help="also cargo check -p leasehold on a copy of exactly the context")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = args.root.resolve()
    if args.self_test:
        return self_test(root)
    patterns = read_dockerignore(root)
    problems, n_context, n_inputs = check(root, patterns)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        print(f"build context: {len(problems)} compile-time inputs missing (fix .dockerignore)", file=sys.stderr)
        return 1
    print(f"build context: {n_context} files in context, all {n_inputs} compile-time inputs in it")
    if args.compile:
        return compile_context(root, patterns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
