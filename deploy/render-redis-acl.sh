#!/usr/bin/env bash
# Renders deploy/redis-acl.conf (a template) for a real Redis/Valkey.
#
#   deploy/render-redis-acl.sh [TEMPLATE] > users.acl
#       Every `{{password:ROLE}}` becomes `#<sha256 of the password>`, read from
#       $REDIS_ACL_PASSWORD_<ROLE> (upper case, `-` as `_`, e.g.
#       REDIS_ACL_PASSWORD_BROKER_WORKER); comment and blank lines are dropped
#       (Redis 7.0 refuses them). The output holds hashes only, never a
#       password. Load it with `redis-server --aclfile users.acl` (or
#       `aclfile` in redis.conf, then `ACL LOAD`).
#   deploy/render-redis-acl.sh --access-string ROLE [TEMPLATE]
#       The role's rules without user name, password and `reset…` keywords:
#       the `aws elasticache create-user --access-string` value (ElastiCache
#       takes the password separately and refuses resets in access strings).
#   deploy/render-redis-acl.sh --roles [TEMPLATE]
#       The role names, one a line (`default` excluded).
#
# Passwords must be 16-128 characters from A-Z a-z 0-9 `. _ ~ -` (URL-safe, so
# a password goes into REDIS_URL as it is; ElastiCache wants 16-128). A missing
# or malformed password fails the whole rendering: no half-written file.
set -euo pipefail

mode=render
role=
case "${1:-}" in
    --access-string) mode=access; role="${2:?--access-string needs a ROLE}"; shift 2 ;;
    --roles) mode=roles; shift ;;
esac
template="${1:-$(dirname "${BASH_SOURCE[0]}")/redis-acl.conf}"

# The user lines of the template (comments and blank lines dropped).
users() {
    grep -Ev '^[[:space:]]*(#|$)' "$template"
}

case "$mode" in
    roles)
        users | awk '$1 == "user" && $2 != "default" { print $2 }'
        exit 0
        ;;
    access)
        line="$(users | awk -v r="$role" '$1 == "user" && $2 == r')"
        [[ -n "$line" ]] || { echo "render-redis-acl: no user $role in $template" >&2; exit 1; }
        # Drop `user NAME`, the password placeholder and the reset keywords.
        echo "$line" | tr ' ' '\n' | tail -n +3 \
            | grep -Ev '^(\{\{password:.*\}\}|resetpass|resetkeys|resetchannels|reset)$' \
            | paste -sd ' ' -
        exit 0
        ;;
esac

out=""
while IFS= read -r line; do
    while [[ "$line" =~ \{\{password:([a-z-]+)\}\} ]]; do
        name="${BASH_REMATCH[1]}"
        var="REDIS_ACL_PASSWORD_$(tr 'a-z-' 'A-Z_' <<<"$name")"
        password="${!var:-}"
        if [[ -z "$password" ]]; then
            echo "render-redis-acl: $var is not set (password of user $name)" >&2
            exit 1
        fi
        if ! [[ "$password" =~ ^[A-Za-z0-9._~-]{16,128}$ ]]; then
            echo "render-redis-acl: $var must be 16-128 characters of A-Z a-z 0-9 . _ ~ -" >&2
            exit 1
        fi
        hash="$(printf '%s' "$password" | sha256sum | cut -d' ' -f1)"
        line="${line/"{{password:$name}}"/#$hash}"
    done
    out+="$line"$'\n'
done < <(users)
printf '%s' "$out"
