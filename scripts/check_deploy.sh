#!/usr/bin/env bash
# Validates deploy/ without network access (after cfn-lint is installed once):
#   1. cfn-lint on every CloudFormation template in deploy/,
#   2. every deploy/**/*.json is well-formed JSON,
#   3. cfn-lint's IAM rules on every deploy/iam policy (action names exist),
#      wrapped into a generated template; a misspelt action must make it fail,
#   4. scripts/check_task_definitions.py: the task definitions against the ECS
#      API model and, with the IAM policies, against the code (variable names
#      from docs/configuration.md, subcommands, the DynamoDB and ECS calls the
#      code makes), then its self-test, which breaks a copy of each file in one
#      way at a time and fails unless every break is caught.
# Standalone: `bash scripts/check_deploy.sh` (from any directory). scripts/test.sh
# may call it the same way. Exit status 0 only when every step passes.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

log() { printf '\n== %s\n' "$*" >&2; }

# cfn-lint exactly as scripts/services.sh finds it: $cfn_lint if a caller that
# sourced services.sh exported it, else the machine's own when importable, else
# the cached venv (installed there on first use, the only step needing PyPI).
if [[ -z "${cfn_lint:-}" ]]; then
    cfn_lint=cfn-lint
    if ! python3 -c 'import cfnlint' 2>/dev/null || ! command -v cfn-lint >/dev/null; then
        venv="${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/venv"
        if ! "$venv/bin/python" -c 'import cfnlint' 2>/dev/null; then
            log "installing cfn-lint into $venv"
            [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
            "$venv/bin/pip" install -q cfn-lint
        fi
        cfn_lint="$venv/bin/cfn-lint"
    fi
fi

# The checker needs botocore (the ECS API model): the Python that has cfn-lint
# has it, because cfn-lint depends on aws-sam-translator, which depends on boto3.
python=python3
if ! python3 -c 'import botocore' 2>/dev/null; then
    python="$(dirname "$(command -v "$cfn_lint")")/python"
fi

log "cfn-lint deploy/*.yaml"
templates=(deploy/*.yaml)
"$cfn_lint" "${templates[@]}"
echo "cfn-lint: ${#templates[@]} templates clean (${templates[*]})"

log "JSON well-formedness"
count=0
while IFS= read -r -d '' file; do
    python3 -m json.tool "$file" >/dev/null || { echo "error: $file is not valid JSON" >&2; exit 1; }
    count=$((count + 1))
done < <(find deploy -name '*.json' -print0 | sort -z)
echo "json: $count files well-formed"

log "cfn-lint IAM rules on deploy/iam/*.json"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" scripts/check_task_definitions.py --iam-template >"$tmp/iam.json"
"$cfn_lint" "$tmp/iam.json"
sed 's/"dynamodb:UpdateItem"/"dynamodb:UpdateItems"/' "$tmp/iam.json" >"$tmp/iam-broken.json"
if "$cfn_lint" "$tmp/iam-broken.json" >/dev/null 2>&1; then
    echo "error: cfn-lint accepted a misspelt IAM action; the IAM check is not working" >&2
    exit 1
fi
echo "iam: $(ls deploy/iam/*.json | wc -l) policies clean; a misspelt action is rejected"

log "task definitions and IAM policies against the code"
"$python" scripts/check_task_definitions.py
"$python" scripts/check_task_definitions.py --self-test
